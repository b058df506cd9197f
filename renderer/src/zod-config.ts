import { config } from "zod";

// zod compiles object parsers with `new Function` when it can; the renderer's CSP forbids eval,
// and even zod's probe for it shows up as a CSP violation. Validate without it.
config({ jitless: true });
