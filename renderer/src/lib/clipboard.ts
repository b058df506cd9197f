/** Copies text; the Clipboard API needs a secure context (loopback and file:// are). */
export async function copyText(text: string): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    return false;
  }
}
