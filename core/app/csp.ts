/**
 * The renderer's content security policy, the same in Electron (app:// responses) and web mode
 * (HTTP responses): only its own bundled scripts and styles, no eval, no plugins, no frames or
 * workers, network only to its own origin (web mode's calls and event stream; in Electron the
 * renderer reaches main through the preload bridge, so 'self' only covers its own assets), and
 * nothing remote (a markdown image in a reply that points at the network stays blank).
 * `style-src 'unsafe-inline'` is deliberately absent: React and uPlot set styles through the
 * CSSOM, which CSP does not restrict; Tailwind's output is a stylesheet file.
 */
export const CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data: blob:",
  "font-src 'self' data:",
  "connect-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
  "frame-src 'none'",
  "worker-src 'none'",
  "manifest-src 'none'",
].join("; ");
