/** Small inline icons (decorative: the buttons carrying them have their own names). */
function StrokeIcon({ d }: { d: string }) {
  return (
    <svg
      aria-hidden="true"
      viewBox="0 0 16 16"
      className="size-3.5"
      fill="none"
      stroke="currentColor"
      strokeWidth="1.5"
    >
      <path d={d} strokeLinejoin="round" />
    </svg>
  );
}

export function PencilIcon() {
  return <StrokeIcon d="M11 2.5l2.5 2.5L6 12.5 3 13l.5-3z" />;
}

export function TrashIcon() {
  return <StrokeIcon d="M3 4.5h10M6.5 4.5V3h3v1.5M4.5 4.5l.7 8.5h5.6l.7-8.5" />;
}

export function PinIcon() {
  return <StrokeIcon d="M6 2.5h4M7 2.5v4L4.5 9h7L9 6.5v-4M8 9v4.5" />;
}
