/**
 * Where a connection's API key is kept. In the desktop app the key is encrypted with the OS
 * keychain through Electron's `safeStorage` (Keychain on macOS, DPAPI on Windows, the Secret
 * Service or KWallet on Linux); core stays Node-only, so Electron hands it in as a SecretBox.
 * Without one (web mode, the CLI, a Linux desktop with no keyring) the key is kept as it is in
 * connections.json, a file only this user may read (0600).
 */

/** The part of Electron's `safeStorage` the store uses (electron/main.ts builds it). */
export interface SecretBox {
  /** False when the OS offers no keychain (Electron's "basic_text" fallback counts as none). */
  isAvailable(): boolean;
  encrypt(plain: string): Buffer;
  decrypt(sealed: Buffer): string;
}

/** How a key is stored in connections.json. */
export type StoredKey =
  | { storage: "keychain"; sealed: string /* base64 of the SecretBox's bytes */ }
  | { storage: "file"; key: string };

/** Seals a key with the box when it works, else keeps it for the 0600 file. */
export function storeKey(key: string, box: SecretBox | null): StoredKey {
  if (box?.isAvailable()) {
    return { storage: "keychain", sealed: box.encrypt(key).toString("base64") };
  }
  return { storage: "file", key };
}
