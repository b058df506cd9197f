/** A tiny SVG line for the aside (decorative: the numbers next to it carry the information). */
export function Sparkline({
  values,
  className = "",
}: {
  values: (number | null)[];
  className?: string;
}) {
  const w = 200;
  const h = 36;
  const max = Math.max(1, ...values.map((v) => v ?? 0));
  const n = values.length;
  let d = "";
  let pen = false;
  values.forEach((v, i) => {
    if (v == null) {
      pen = false;
      return;
    }
    const x = n > 1 ? (i / (n - 1)) * w : 0;
    const y = h - (v / max) * (h - 2) - 1;
    d += `${pen ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
    pen = true;
  });
  return (
    <svg
      aria-hidden="true"
      viewBox={`0 0 ${w} ${h}`}
      preserveAspectRatio="none"
      className={`h-9 w-full text-gauge ${className}`}
    >
      <path
        d={d}
        fill="none"
        stroke="currentColor"
        strokeWidth="1.5"
        vectorEffect="non-scaling-stroke"
      />
    </svg>
  );
}
