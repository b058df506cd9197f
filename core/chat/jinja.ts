/**
 * @huggingface/jinja, configured to render what Python's Jinja2 (the engine transformers renders
 * chat templates with, and so the one model authors test against) renders where the JavaScript
 * port stops with an error. Gemma 4's template upper-cases each parameter's JSON-schema `type`
 * (`value['type'] | upper`, `item_value | map('upper')`); a union type such as
 * `"type": ["string", "null"]`, or a property with no `type` at all (`anyOf`), made the port throw
 * "Unknown ArrayValue filter: upper" and the server answer 400. Jinja2 upper-cases `str(value)`:
 * `['STRING', 'NULL']`, `NONE`, or an empty string for an undefined value.
 *
 * The extension is installed once on the interpreter's filter dispatch and only takes over
 * inputs that the port rejects, so every template that rendered before renders the same bytes.
 */
import { Environment, Interpreter, Template } from "@huggingface/jinja";

export { Template };

/** The runtime values of @huggingface/jinja, as far as this module reads them. */
interface RuntimeValue {
  type: string;
  value: unknown;
}
interface FilterNode {
  type: string;
  value?: string;
  callee?: { type: string; value?: string };
  args?: { type: string; value?: unknown }[];
}
type ApplyFilter = (operand: RuntimeValue, filter: FilterNode, env: Environment) => RuntimeValue;

const CASE_FILTERS: Record<string, (s: string) => string> = {
  upper: (s) => s.toUpperCase(),
  lower: (s) => s.toLowerCase(),
};

/** A JavaScript value as a template runtime value (the port's own conversion). */
function runtimeValue(value: unknown): RuntimeValue {
  const env = new Environment();
  env.set("value", value);
  return env.lookupVariable("value") as unknown as RuntimeValue;
}

/** Python's repr() of a string: single quotes unless the text has one and no double quote. */
function pythonStringRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = "";
  for (const ch of s) {
    if (ch === "\\" || ch === quote) out += `\\${ch}`;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (ch < " " || ch === "\x7f")
      out += `\\x${ch.charCodeAt(0).toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return quote + out + quote;
}

/** Python's str() of a runtime value (repr() inside containers). */
function pythonStr(v: RuntimeValue, nested = false): string {
  switch (v.type) {
    case "StringValue":
      return nested ? pythonStringRepr(v.value as string) : (v.value as string);
    case "BooleanValue":
      return v.value ? "True" : "False";
    case "NullValue":
      return "None";
    case "UndefinedValue":
      return "";
    case "ArrayValue":
    case "TupleValue": {
      const items = (v.value as RuntimeValue[]).map((x) => pythonStr(x, true)).join(", ");
      return v.type === "TupleValue" ? `(${items})` : `[${items}]`;
    }
    case "ObjectValue": {
      const entries = [...(v.value as Map<string, RuntimeValue>)].map(
        ([k, x]) => `${pythonStringRepr(k)}: ${pythonStr(x, true)}`,
      );
      return `{${entries.join(", ")}}`;
    }
    default:
      return String(v as unknown);
  }
}

const PATCHED = Symbol.for("redwing.jinja.pythonCaseFilters");

function install(): void {
  const proto = Interpreter.prototype as unknown as { applyFilter: ApplyFilter; [PATCHED]?: true };
  if (proto[PATCHED]) return;
  const original = proto.applyFilter;
  proto.applyFilter = function (this: Interpreter, operand, filter, env) {
    const caseFilter = filter.type === "Identifier" ? CASE_FILTERS[filter.value!] : undefined;
    if (caseFilter && operand.type !== "StringValue") {
      return runtimeValue(caseFilter(pythonStr(operand)));
    }
    // `list | map('upper')`: the port only knows map(attribute=...).
    const arg = filter.args?.[0];
    if (
      filter.type === "CallExpression" &&
      filter.callee?.value === "map" &&
      filter.args?.length === 1 &&
      arg?.type === "StringLiteral" &&
      (operand.type === "ArrayValue" || operand.type === "TupleValue")
    ) {
      const byName: FilterNode = { type: "Identifier", value: arg.value as string };
      const mapped = (operand.value as RuntimeValue[]).map((item) =>
        proto.applyFilter.call(this, item, byName, env),
      );
      const ArrayValue = operand.constructor as new (value: RuntimeValue[]) => RuntimeValue;
      return new ArrayValue(mapped);
    }
    return original.call(this, operand, filter, env);
  };
  proto[PATCHED] = true;
}

install();
