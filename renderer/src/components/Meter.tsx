/**
 * A horizontal gauge with role="meter". `value` may exceed `max` (memory over budget): the bar is
 * full and turns to the warning colour, while aria-valuenow keeps the real number.
 */
export function Meter({
  label,
  value,
  max,
  valueText,
  id,
}: {
  label: string;
  value: number;
  max: number;
  valueText: string;
  id?: string;
}) {
  const fraction = max > 0 ? value / max : 0;
  const tone = fraction > 1 ? "bg-danger" : fraction > 0.85 ? "bg-warn" : "bg-gauge";
  return (
    <div
      id={id}
      role="meter"
      aria-label={label}
      aria-valuemin={0}
      aria-valuemax={max}
      aria-valuenow={value}
      aria-valuetext={valueText}
      className="h-2.5 w-full overflow-hidden rounded-full bg-panel-2"
    >
      <div
        className={`h-full rounded-full transition-[width] duration-300 ${tone}`}
        style={{ width: `${Math.min(100, Math.max(0, fraction * 100)).toFixed(1)}%` }}
      />
    </div>
  );
}
