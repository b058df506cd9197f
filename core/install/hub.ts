/**
 * A small Hugging Face hub client for the installer, speaking only the hub's standard
 * endpoints, as huggingface_hub does:
 *
 * - `GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true`: the commit a branch, tag
 *   or commit resolves to, and every file with its size, git blob id and LFS SHA-256.
 * - `HEAD|GET {endpoint}/{repo}/resolve/{commit}/{path}`: file bytes, with `Range`. The hub
 *   answers with `X-Repo-Commit`, `ETag` / `X-Linked-Etag` and `X-Linked-Size` and usually
 *   redirects LFS files to a CDN; redirects are followed by hand so that every hop is checked
 *   and the token is only ever sent to the endpoint's own origin.
 *
 * `HF_ENDPOINT` selects a mirror; `HF_TOKEN` (or huggingface_hub's token file) is sent as a
 * bearer token for gated and private repositories. Every request is pinned to a commit, and
 * each response is checked against it (`X-Repo-Commit`), against the file's identity seen when
 * the install was planned (`X-Linked-Etag` / `ETag`, size), and, for ranges, against
 * `Content-Range`; the data server's own ETag must stay the same for the whole session.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { z } from "zod";
import { UserError } from "../errors.ts";
import { DEFAULT_RETRY, RetryableError, parseRetryAfter, type RetryPolicy } from "./retry.ts";

type Env = Record<string, string | undefined>;

export const DEFAULT_ENDPOINT = "https://huggingface.co";
/**
 * The revision API's answer (a file listing) is read whole; the largest real listings are a
 * few MiB, so this only stops an endless or absurd body.
 */
export const MAX_REVISION_BYTES = 32 * 1024 * 1024;
/**
 * Files read whole into memory (config, tokenizer, index...): Gemma's tokenizer.json, the
 * largest, is 33 MiB. Shards are never read whole.
 */
export const MAX_WHOLE_FILE_BYTES = 64 * 1024 * 1024;

/** The hub endpoint: `HF_ENDPOINT` (a mirror) or huggingface.co, without a trailing slash. */
export function hubEndpoint(env: Env = process.env): string {
  const value = env.HF_ENDPOINT?.trim();
  const endpoint = value ? value : DEFAULT_ENDPOINT;
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    throw new UserError(`HF_ENDPOINT ${JSON.stringify(endpoint)} is not a URL`, "bad_endpoint");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new UserError(
      `HF_ENDPOINT ${JSON.stringify(endpoint)} is not an http(s) URL`,
      "bad_endpoint",
    );
  }
  return endpoint.replace(/\/+$/, "");
}

/**
 * The access token, found like huggingface_hub finds it: `HF_TOKEN`, then the legacy
 * `HUGGING_FACE_HUB_TOKEN`, then the token file (`HF_TOKEN_PATH`, else `$HF_HOME/token`, else
 * `~/.cache/huggingface/token`, as `huggingface-cli login` writes it). Null when none.
 */
export function hubToken(env: Env = process.env): string | null {
  for (const name of ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]) {
    const v = env[name]?.trim();
    if (v) return v;
  }
  const home = env.HF_HOME ?? join(env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "huggingface");
  const path = env.HF_TOKEN_PATH ?? join(home, "token");
  try {
    const v = readFileSync(path, "utf8").trim();
    return v || null;
  } catch {
    return null;
  }
}

export interface HubOptions {
  endpoint: string;
  token: string | null;
  retry: RetryPolicy;
  /** A request that receives no bytes for this long is abandoned and retried. */
  stallTimeoutMs: number;
  userAgent: string;
}

export function defaultHubOptions(env: Env = process.env): HubOptions {
  return {
    endpoint: hubEndpoint(env),
    token: hubToken(env),
    retry: DEFAULT_RETRY,
    stallTimeoutMs: 30_000,
    userAgent: `redwing/0.1.0; node/${process.versions.node}`,
  };
}

/** One file of a revision, as the revision API lists it. */
export interface RepoFile {
  path: string;
  size: number;
  /** Git blob id (SHA-1 of the git object), null when the server does not say. */
  blobId: string | null;
  /** SHA-256 of the content for LFS files, null for files stored in git. */
  lfsSha256: string | null;
}

export interface RevisionInfo {
  repo: string;
  commit: string;
  files: RepoFile[];
}

/** What the hub said about a file when the install was planned; later responses must agree. */
export interface FileIdentity {
  /** Normalized ETag of the resolve response (`X-Linked-Etag` for LFS files). */
  etag: string | null;
  size: number;
}

/** The hub's file changed under the installer (ETag, commit or size): fatal for this run. */
export class SourceChangedError extends UserError {
  constructor(message: string) {
    super(message, "source_changed");
  }
}

const RevisionSchema = z.object({
  sha: z.string().regex(/^[0-9a-f]{40}$/),
  siblings: z.array(
    z.object({
      rfilename: z.string(),
      size: z.number().int().nonnegative().optional(),
      blobId: z.string().optional(),
      lfs: z
        .object({
          sha256: z.string().optional(),
          oid: z.string().optional(),
          size: z.number().optional(),
        })
        .nullable()
        .optional(),
    }),
  ),
});

/** Strips a weak marker and quotes, as huggingface_hub normalizes ETags. */
export function normalizeEtag(value: string | null): string | null {
  if (value === null) return null;
  const v = value
    .trim()
    .replace(/^W\//, "")
    .replace(/^"(.*)"$/, "$1");
  return v || null;
}

/** Git's object id of a blob: SHA-1 of `blob <size>\0<content>`. */
export function gitBlobId(content: Uint8Array): string {
  return createHash("sha1").update(`blob ${content.byteLength}\0`).update(content).digest("hex");
}

const NETWORK_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ENOTFOUND",
  "EAI_AGAIN",
  "ENETUNREACH",
  "EHOSTUNREACH",
  "ETIMEDOUT",
  "EPIPE",
  "UND_ERR_SOCKET",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
]);

/** True for a RetryableError caused by the network (not by a server answer). */
export function isNetworkFailure(error: unknown): boolean {
  return error instanceof RetryableError && error.code !== null && NETWORK_CODES.has(error.code);
}

class StallError extends Error {}

function causeCode(error: unknown): string | null {
  let e: unknown = error;
  for (let i = 0; i < 4 && e; i++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") return code;
    e = (e as { cause?: unknown }).cause;
  }
  return null;
}

export interface RangeRequest {
  repo: string;
  commit: string;
  file: RepoFile;
  identity: FileIdentity;
  start: number;
  length: number;
  signal?: AbortSignal;
  /** Called with the number of body bytes received (negative to take back a failed attempt). */
  onBytes?: (n: number) => void;
}

/** What a request is about, for error messages. */
interface Subject {
  repo: string;
  revision: string;
  path?: string;
}

export class HubClient {
  /** Data-server ETag first seen per file in this session (`repo@commit/path`). */
  private readonly dataEtags = new Map<string, string>();
  private warnedNoRange = false;

  constructor(
    readonly options: HubOptions,
    /** Notes for the user (e.g. a server that ignores Range). */
    private readonly onNote: (note: string) => void = () => undefined,
  ) {}

  get endpoint(): string {
    return this.options.endpoint;
  }

  /** Web page of a repository (where its licence is accepted). */
  repoPage(repo: string): string {
    return `${this.options.endpoint}/${repo}`;
  }

  fileUrl(repo: string, commit: string, path: string): string {
    return `${this.options.endpoint}/${repo}/resolve/${encodeURIComponent(commit)}/${path
      .split("/")
      .map(encodeURIComponent)
      .join("/")}`;
  }

  /** Resolves `revision` (branch, tag or commit) and lists the files of that commit. */
  async revisionInfo(repo: string, revision: string, signal?: AbortSignal): Promise<RevisionInfo> {
    const url = `${this.options.endpoint}/api/models/${repo}/revision/${encodeURIComponent(revision)}?blobs=true`;
    const subject = { repo, revision };
    const { res } = await this.send(url, "GET", {}, subject, signal, () => undefined);
    let json: unknown;
    try {
      json = JSON.parse(
        await this.readText(res, signal, MAX_REVISION_BYTES, `the revision API for ${repo}`),
      );
    } catch (error) {
      if (error instanceof RetryableError || error instanceof UserError) throw error;
      throw new RetryableError(
        `the hub's revision API returned invalid JSON for ${repo}@${revision}`,
      );
    }
    const parsed = RevisionSchema.safeParse(json);
    if (!parsed.success) {
      throw new UserError(
        `the hub at ${this.options.endpoint} answered the revision API for ${repo}@${revision} with something unexpected: ${parsed.error.issues[0]?.message ?? ""}`,
        "hub_protocol",
      );
    }
    if (/^[0-9a-f]{40}$/.test(revision) && parsed.data.sha !== revision) {
      throw new SourceChangedError(
        `the hub resolved commit ${revision} of ${repo} to ${parsed.data.sha}; refusing to mix commits`,
      );
    }
    const files: RepoFile[] = parsed.data.siblings.map((s) => ({
      path: s.rfilename,
      size: s.size ?? s.lfs?.size ?? -1,
      blobId: s.blobId ?? null,
      lfsSha256: s.lfs ? (s.lfs.sha256 ?? s.lfs.oid ?? null) : null,
    }));
    return { repo, commit: parsed.data.sha, files };
  }

  /**
   * HEAD of a file at a commit (not following redirects to other origins, like huggingface_hub):
   * its ETag and size, checked against the commit.
   */
  async headFile(
    repo: string,
    commit: string,
    path: string,
    signal?: AbortSignal,
  ): Promise<FileIdentity> {
    const subject = { repo, revision: commit, path };
    let identity: FileIdentity | null = null;
    const { res } = await this.send(
      this.fileUrl(repo, commit, path),
      "HEAD",
      {},
      subject,
      signal,
      (hop) => {
        if (identity) return;
        this.checkCommit(hop, commit, subject);
        const etag = normalizeEtag(hop.headers.get("x-linked-etag") ?? hop.headers.get("etag"));
        const size = Number(
          hop.headers.get("x-linked-size") ?? hop.headers.get("content-length") ?? NaN,
        );
        if (hop.headers.has("x-repo-commit") || hop.headers.has("x-linked-etag")) {
          identity = { etag, size: Number.isSafeInteger(size) ? size : -1 };
        }
      },
      true,
    );
    await res.body?.cancel().catch(() => undefined);
    if (identity) return identity;
    const size = Number(res.headers.get("content-length") ?? NaN);
    return {
      etag: normalizeEtag(res.headers.get("etag")),
      size: Number.isSafeInteger(size) ? size : -1,
    };
  }

  /**
   * A whole (small) file, checked against its size and hash: the LFS SHA-256, else the git blob
   * id. A mismatch is retried (it can only be damage in transit) and then fails.
   */
  async getFile(
    repo: string,
    commit: string,
    file: RepoFile,
    signal?: AbortSignal,
    onBytes?: (n: number) => void,
  ): Promise<Buffer> {
    const subject = { repo, revision: commit, path: file.path };
    // The size comes from the hub's listing: never allocate what a listing merely claims.
    if (!Number.isSafeInteger(file.size) || file.size < 0 || file.size > MAX_WHOLE_FILE_BYTES) {
      throw new UserError(
        `${repo} lists ${file.path} at ${file.size} bytes; Redwing reads such files whole and accepts at most ${MAX_WHOLE_FILE_BYTES} bytes (real ones are far smaller)`,
        "file_too_large",
      );
    }
    const { res } = await this.send(
      this.fileUrl(repo, commit, file.path),
      "GET",
      {},
      subject,
      signal,
      (hop) => this.checkCommit(hop, commit, subject),
    );
    if (res.status !== 200) {
      await res.body?.cancel().catch(() => undefined);
      throw new RetryableError(`unexpected status ${res.status} for ${file.path}`);
    }
    const body = await this.readBody(res, 0, file.size, signal, onBytes, file.path, true);
    if (file.lfsSha256) {
      const sha = createHash("sha256").update(body).digest("hex");
      if (sha !== file.lfsSha256) {
        throw new RetryableError(
          `${file.path} arrived with SHA-256 ${sha}, the hub lists ${file.lfsSha256}`,
        );
      }
    } else if (file.blobId) {
      const id = gitBlobId(body);
      if (id !== file.blobId) {
        throw new RetryableError(
          `${file.path} arrived with git blob id ${id}, the hub lists ${file.blobId}`,
        );
      }
    }
    return body;
  }

  /** `length` bytes at `start` of a file, with a Range request; see the checks above. */
  async getRange(req: RangeRequest): Promise<Buffer> {
    const { repo, commit, file, identity, start, length, signal } = req;
    const subject = { repo, revision: commit, path: file.path };
    const end = start + length - 1;
    const key = `${repo}@${commit}/${file.path}`;
    const { res } = await this.send(
      this.fileUrl(repo, commit, file.path),
      "GET",
      { range: `bytes=${start}-${end}` },
      subject,
      signal,
      (hop) => this.checkIdentity(hop, commit, identity, subject),
      false,
      true,
    );
    // The data server's ETag (a CDN's may differ from the hub's) must not change mid-install.
    const dataEtag = normalizeEtag(res.headers.get("etag"));
    if (dataEtag !== null && !res.headers.has("x-repo-commit")) {
      const seen = this.dataEtags.get(key);
      if (seen === undefined) this.dataEtags.set(key, dataEtag);
      else if (seen !== dataEtag) {
        await res.body?.cancel().catch(() => undefined);
        throw new SourceChangedError(
          `${file.path} of ${repo} changed on the server during the download (ETag ${seen} became ${dataEtag}); run the install again to start it over`,
        );
      }
    }
    if (res.status === 206) {
      const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(res.headers.get("content-range") ?? "");
      if (m && m[3] !== "*" && Number(m[3]) !== file.size) {
        await res.body?.cancel().catch(() => undefined);
        throw new SourceChangedError(
          `${file.path} of ${repo} has ${m[3]} bytes on the server, the hub listed ${file.size}; it changed during the install`,
        );
      }
      if (!m || Number(m[1]) !== start || Number(m[2]) !== end) {
        await res.body?.cancel().catch(() => undefined);
        throw new RetryableError(
          `the server answered bytes ${start}-${end} of ${file.path} with Content-Range ${JSON.stringify(res.headers.get("content-range"))}`,
        );
      }
      return this.readBody(res, 0, length, signal, req.onBytes, file.path, true);
    }
    if (res.status === 200) {
      // The server ignored Range and sends the whole file: take our slice from the stream.
      const total = Number(res.headers.get("content-length") ?? NaN);
      if (Number.isSafeInteger(total) && total !== file.size) {
        await res.body?.cancel().catch(() => undefined);
        throw new SourceChangedError(
          `${file.path} of ${repo} has ${total} bytes on the server, the hub listed ${file.size}; it changed during the install`,
        );
      }
      if (!(start === 0 && length === file.size) && !this.warnedNoRange) {
        this.warnedNoRange = true;
        this.onNote(
          `the server ignores HTTP Range requests (answers 200 instead of 206); each piece is cut from a full download, which is much slower. Use another HF_ENDPOINT if you can.`,
        );
      }
      return this.readBody(res, start, length, signal, req.onBytes, file.path, false);
    }
    await res.body?.cancel().catch(() => undefined);
    if (res.status === 416) {
      const m = /^bytes \*\/(\d+)$/.exec(res.headers.get("content-range") ?? "");
      if (m && Number(m[1]) !== file.size) {
        throw new SourceChangedError(
          `${file.path} of ${repo} has ${m[1]} bytes on the server, the hub listed ${file.size}; it changed during the install`,
        );
      }
      throw new RetryableError(`the server refused bytes ${start}-${end} of ${file.path} (416)`);
    }
    throw new RetryableError(
      `unexpected status ${res.status} for bytes ${start}-${end} of ${file.path}`,
    );
  }

  private checkCommit(hop: Response, commit: string, subject: Subject): void {
    const got = hop.headers.get("x-repo-commit");
    if (got !== null && got !== commit) {
      throw new SourceChangedError(
        `the hub served ${subject.path ?? "a file"} of ${subject.repo} from commit ${got}, not the commit being installed (${commit}); refusing to mix commits`,
      );
    }
  }

  /** Resolve responses (those with X-Repo-Commit) must match the planned commit and ETag. */
  private checkIdentity(
    hop: Response,
    commit: string,
    identity: FileIdentity,
    subject: Subject,
  ): void {
    if (!hop.headers.has("x-repo-commit")) return;
    this.checkCommit(hop, commit, subject);
    const etag = normalizeEtag(hop.headers.get("x-linked-etag") ?? hop.headers.get("etag"));
    if (identity.etag !== null && etag !== null && etag !== identity.etag) {
      throw new SourceChangedError(
        `${subject.path} of ${subject.repo} changed on the hub during the install (ETag ${identity.etag} became ${etag}); run the install again to start it over`,
      );
    }
  }

  /**
   * Sends a request, following redirects by hand (at most 10). `onHop` sees every response,
   * redirects included. With `sameOriginOnly`, a redirect to another origin is not followed and
   * the redirect itself is returned (HEAD metadata lives on the hub's response).
   */
  private async send(
    url: string,
    method: "GET" | "HEAD",
    headers: Record<string, string>,
    subject: Subject,
    signal: AbortSignal | undefined,
    onHop: (hop: Response) => void,
    sameOriginOnly = false,
    /** Return a 416 to the caller (range requests judge it themselves). */
    pass416 = false,
  ): Promise<{ res: Response; url: URL }> {
    const endpointOrigin = new URL(this.options.endpoint).origin;
    let current = new URL(url);
    for (let hop = 0; hop <= 10; hop++) {
      const h: Record<string, string> = {
        "user-agent": this.options.userAgent,
        "accept-encoding": "identity",
        ...headers,
      };
      // The token goes to the endpoint only, never to a CDN or another host it redirects to.
      if (this.options.token && current.origin === endpointOrigin) {
        h.authorization = `Bearer ${this.options.token}`;
      }
      const res = await this.fetchWithStall(current, method, h, signal);
      const location = res.headers.get("location");
      if (res.status >= 300 && res.status < 400 && location) {
        try {
          onHop(res);
        } finally {
          await res.body?.cancel().catch(() => undefined);
        }
        let next: URL;
        try {
          next = new URL(location, current);
        } catch {
          throw new UserError(
            `the hub redirected ${current.href} to ${JSON.stringify(location)}, which is not a URL`,
            "hub_protocol",
          );
        }
        if (next.protocol !== "http:" && next.protocol !== "https:") {
          throw new UserError(
            `the hub redirected ${current.href} to ${next.href}, which is not an http(s) URL; refusing to follow it`,
            "hub_protocol",
          );
        }
        if (sameOriginOnly && next.origin !== current.origin) return { res, url: current };
        current = next;
        continue;
      }
      if (res.status >= 400 && !(pass416 && res.status === 416)) {
        const error = await this.statusError(res, subject);
        throw error;
      }
      onHop(res);
      return { res, url: current };
    }
    throw new UserError(`too many redirects for ${url}`, "hub_protocol");
  }

  private async fetchWithStall(
    url: URL,
    method: string,
    headers: Record<string, string>,
    signal: AbortSignal | undefined,
  ): Promise<Response> {
    const stall = new AbortController();
    const timer = setTimeout(() => stall.abort(new StallError()), this.options.stallTimeoutMs);
    const combined = signal ? AbortSignal.any([signal, stall.signal]) : stall.signal;
    try {
      return await fetch(url, { method, headers, redirect: "manual", signal: combined });
    } catch (error) {
      throw this.networkError(error, url, signal);
    } finally {
      clearTimeout(timer);
    }
  }

  private networkError(error: unknown, url: URL, signal: AbortSignal | undefined): unknown {
    if (signal?.aborted) return signal.reason;
    if (error instanceof StallError || (error as { name?: string })?.name === "StallError") {
      return new RetryableError(
        `no data from ${url.host} for ${this.options.stallTimeoutMs / 1000} s`,
        null,
        "ETIMEDOUT",
      );
    }
    const code = causeCode(error) ?? "ECONNRESET";
    return new RetryableError(`${url.host}: ${(error as Error).message} (${code})`, null, code);
  }

  /** Turns an error status into a retryable error or a UserError that says what to do. */
  private async statusError(res: Response, subject: Subject): Promise<Error> {
    const code = res.headers.get("x-error-code");
    const serverMessage = res.headers.get("x-error-message");
    await res.body?.cancel().catch(() => undefined);
    const status = res.status;
    if (status === 429 || status === 408 || status >= 500) {
      return new RetryableError(
        `the server answered ${status}${serverMessage ? ` (${serverMessage})` : ""}`,
        parseRetryAfter(res.headers.get("retry-after")),
      );
    }
    const { repo, revision, path } = subject;
    const page = this.repoPage(repo);
    const hasToken = this.options.token !== null;
    if (status === 401 || status === 403) {
      if (code === "GatedRepo" || (code !== "RepoNotFound" && (status === 403 || hasToken))) {
        return new UserError(
          hasToken
            ? `${repo} is gated and the token in HF_TOKEN has no access to it: open ${page}, sign in with that token's account, accept the licence, and try again`
            : `${repo} is gated (or private): open ${page}, sign in, accept the licence, then create a read token at ${this.options.endpoint}/settings/tokens and set HF_TOKEN to it`,
          "gated",
        );
      }
      return new UserError(
        `${repo} was not found on ${this.options.endpoint} (or it is private: then set HF_TOKEN to a token that can read it)`,
        "repo_not_found",
      );
    }
    if (status === 404) {
      if (code === "RevisionNotFound") {
        return new UserError(
          `revision ${revision} was not found in ${repo} (see ${page})`,
          "revision_not_found",
        );
      }
      if (code === "EntryNotFound" && path !== undefined) {
        return new UserError(
          `${path} was not found in ${repo} at revision ${revision}`,
          "file_not_found",
        );
      }
      if (path !== undefined && code !== "RepoNotFound") {
        return new UserError(
          `${path} was not found in ${repo} at revision ${revision}`,
          "file_not_found",
        );
      }
      return new UserError(
        code === "RepoNotFound" || path === undefined
          ? `${repo} (revision ${revision}) was not found on ${this.options.endpoint}; check the name${hasToken ? "" : ", or set HF_TOKEN if it is private"}`
          : `not found: ${repo}`,
        code === "RepoNotFound" || path === undefined ? "repo_not_found" : "file_not_found",
      );
    }
    return new UserError(
      `the hub at ${this.options.endpoint} answered ${status}${serverMessage ? ` (${serverMessage})` : ""} for ${repo}${path ? `/${path}` : ""}`,
      "hub_error",
    );
  }

  /**
   * A whole text body of at most `maxBytes`: a server that sends more (an endless body) gets a
   * clear error once the cap is reached, never an unbounded buffer.
   */
  private async readText(
    res: Response,
    signal: AbortSignal | undefined,
    maxBytes: number,
    what: string,
  ): Promise<string> {
    const chunks: Buffer[] = [];
    let total = 0;
    let tooLarge = false;
    await this.pump(res, signal, (chunk) => {
      total += chunk.byteLength;
      if (total > maxBytes) {
        tooLarge = true;
        return false;
      }
      chunks.push(Buffer.from(chunk));
      return true;
    });
    if (tooLarge) {
      throw new UserError(
        `the hub at ${this.options.endpoint} sent more than ${maxBytes} bytes for ${what}; a real answer is far smaller, so the hub (or something in between) is broken or hostile`,
        "hub_protocol",
      );
    }
    return Buffer.concat(chunks).toString("utf8");
  }

  /**
   * Reads `length` body bytes after skipping `skip` of them. With `exact`, the body must have
   * exactly `length` bytes. A body that ends early is retryable.
   */
  private async readBody(
    res: Response,
    skip: number,
    length: number,
    signal: AbortSignal | undefined,
    onBytes: ((n: number) => void) | undefined,
    what: string,
    exact: boolean,
  ): Promise<Buffer> {
    const out = Buffer.allocUnsafe(length);
    let seen = 0;
    let filled = 0;
    let tooLong = false;
    try {
      await this.pump(res, signal, (chunk) => {
        const from = Math.max(0, skip - seen);
        seen += chunk.byteLength;
        if (from >= chunk.byteLength) return true;
        const take = Math.min(chunk.byteLength - from, length - filled);
        if (take < chunk.byteLength - from && exact) {
          tooLong = true;
          return false;
        }
        out.set(chunk.subarray(from, from + take), filled);
        filled += take;
        onBytes?.(take);
        return filled < length;
      });
    } catch (error) {
      onBytes?.(-filled);
      throw error;
    }
    if (tooLong) {
      onBytes?.(-filled);
      throw new RetryableError(
        `the server sent more than the ${length} bytes asked for of ${what}`,
      );
    }
    if (filled < length) {
      onBytes?.(-filled);
      throw new RetryableError(
        `the connection closed after ${filled} of ${length} bytes of ${what}`,
        null,
        "ECONNRESET",
      );
    }
    return out;
  }

  /** Feeds body chunks to `take` until it returns false; a stall aborts with a retryable error. */
  private async pump(
    res: Response,
    signal: AbortSignal | undefined,
    take: (chunk: Uint8Array) => boolean,
  ): Promise<void> {
    if (!res.body) return;
    const reader = res.body.getReader();
    // One timer per body checks for silence (re-arming a timer per chunk costs more).
    let stalled = false;
    let lastData = Date.now();
    const limit = this.options.stallTimeoutMs;
    const timer = setInterval(
      () => {
        if (Date.now() - lastData < limit) return;
        stalled = true;
        void reader.cancel().catch(() => undefined);
      },
      Math.max(10, Math.min(1000, limit / 4)),
    );
    const onAbort = (): void => void reader.cancel().catch(() => undefined);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      for (;;) {
        let r: ReadableStreamReadResult<Uint8Array>;
        try {
          r = await reader.read();
        } catch (error) {
          if (signal?.aborted) throw signal.reason;
          const code = causeCode(error) ?? "ECONNRESET";
          throw new RetryableError(
            `the connection failed mid-download: ${(error as Error).message}`,
            null,
            code,
          );
        }
        if (signal?.aborted) throw signal.reason;
        if (stalled) {
          throw new RetryableError(
            `no data for ${this.options.stallTimeoutMs / 1000} s; retrying`,
            null,
            "ETIMEDOUT",
          );
        }
        if (r.done) return;
        lastData = Date.now();
        if (!take(r.value)) {
          await reader.cancel().catch(() => undefined);
          return;
        }
      }
    } finally {
      clearInterval(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }
}
