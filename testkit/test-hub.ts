/**
 * A local stand-in for the Hugging Face hub, for tests and benchmarks: listens on 127.0.0.1 on
 * ephemeral ports only. It serves repositories held in memory like the hub does:
 *
 * - `GET /api/models?search=&filter=&sort=downloads&limit=&expand=`: the model search, over the
 *   repositories' ids, with each repository's card facts (RepoOptions.info), its files and a
 *   digest of its config.json (`architectures`, `model_type`, `quantization_config`) as the hub
 *   gives them; gated repositories are listed (their files need the token);
 * - `GET /api/models/{repo}/revision/{rev}?blobs=true` (sha, siblings with size, blobId, lfs);
 * - `HEAD|GET /{repo}/resolve/{rev}/{path}`: LFS files (`*.safetensors`, `tokenizer.json`) get
 *   a 302 to a separate CDN origin with `X-Repo-Commit`, `X-Linked-Etag`, `X-Linked-Size`;
 *   other files are served directly with their git blob id as ETag;
 * - the CDN: `HEAD|GET /lfs/{sha256}` with Range (206, Content-Range, 416) and its own ETag;
 * - renamed repositories answer 307 with a relative Location; gated ones need a bearer token
 *   (401 GatedRepo without, 403 with a wrong one); unknown repos, revisions and files get the
 *   hub's 401/404 with `X-Error-Code`.
 *
 * Faults can be injected per request: dropped connections, error statuses with Retry-After,
 * 416, ignoring Range, altered bytes, slow (trickle) and stalled bodies, a changed ETag or
 * commit. Counters record what was served.
 */
import { createHash } from "node:crypto";
import { readFile, readdir } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { type AddressInfo } from "node:net";
import { join } from "node:path";
import { gitBlobId } from "../core/install/hub.ts";

export type FaultAction =
  /** Send the headers and `afterBytes` of the body, then destroy the connection. */
  | { kind: "drop"; afterBytes: number }
  /** Answer with this status (and Retry-After / Content-Range when given). */
  | { kind: "status"; status: number; retryAfter?: string; contentRange?: string }
  /** Flip one byte of the body (at `at` into the body, default its middle). */
  | { kind: "alter"; at?: number }
  /** Ignore Range: answer 200 with the whole file. */
  | { kind: "ignore-range" }
  /** Send the body in `chunkBytes` pieces `delayMs` apart. */
  | { kind: "trickle"; chunkBytes: number; delayMs: number }
  /** Send `afterBytes`, then nothing for `ms`, then the rest. */
  | { kind: "stall"; afterBytes: number; ms: number }
  /** Report another data ETag (a CDN whose object changed). */
  | { kind: "etag"; etag: string }
  /** The resolve hop claims another commit. */
  | { kind: "commit"; commit: string }
  /** The resolve hop reports another X-Linked-Etag. */
  | { kind: "linked-etag"; etag: string }
  /** The revision API sends an endless body (until the client goes away). */
  | { kind: "endless" }
  /** The revision API's listing claims `size` bytes for the file `file`. */
  | { kind: "claim-size"; file: string; size: number }
  /** The resolve hop redirects to `location` (any scheme: file://, ftp://...). */
  | { kind: "redirect"; location: string };

export interface Fault {
  /** Requests this applies to: "api", "resolve" (hub hop), "data" (bytes served). */
  on: "api" | "resolve" | "data";
  /** Only for this file path (or matching this pattern). */
  path?: string | RegExp;
  /** Only requests carrying a Range header (true) or not (false). */
  ranged?: boolean;
  /** Only GET requests whose range starts at or after this byte. */
  minStart?: number;
  action: FaultAction;
  /** Matching requests skipped before the fault applies (default 0). */
  skip?: number;
  /** How many matching requests get the fault (default unlimited). */
  times?: number;
  /** Counter: matching requests so far. */
  seen?: number;
}

export interface RepoOptions {
  branch?: string;
  /** Gated: only this bearer token gets in. */
  token?: string;
  /** Which files are stored in LFS (default *.safetensors and tokenizer.json). */
  lfs?: (path: string) => boolean;
  /** What the search API says about the repository besides its files. */
  info?: RepoInfo;
}

/** A repository's card facts, as the hub's model search lists them. */
export interface RepoInfo {
  downloads?: number;
  likes?: number;
  tags?: string[];
  /** The model card's YAML header (`license`, `license_name`, `license_link`...). */
  cardData?: Record<string, unknown>;
  library_name?: string;
  pipeline_tag?: string;
  /** Default: "manual" for a repository with a token, else false. */
  gated?: false | "auto" | "manual";
}

interface StoredFile {
  path: string;
  data: Buffer;
  sha256: string;
  blobId: string;
  lfs: boolean;
}

interface Repo {
  commits: Map<string, Map<string, StoredFile>>;
  refs: Map<string, string>;
  token: string | null;
  info: RepoInfo;
}

export interface LoggedRequest {
  server: "hub" | "cdn";
  method: string;
  url: string;
  range: string | null;
  status: number;
  authorization: boolean;
  /** Date.now() when answered. */
  t: number;
}

export class TestHub {
  readonly repos = new Map<string, Repo>();
  readonly renames = new Map<string, string>();
  readonly faults: Fault[] = [];
  readonly log: LoggedRequest[] = [];
  /** Body bytes sent by data responses (GET), whole or partial. */
  dataBytes = 0;
  /** Set when the CDN ever received an Authorization header (it must not). */
  cdnSawAuthorization = false;
  private readonly lfsIndex = new Map<string, StoredFile>();
  private commitCounter = 0;

  private constructor(
    private readonly hubServer: Server,
    private readonly cdnServer: Server,
  ) {}

  static async start(): Promise<TestHub> {
    const hubServer = createServer();
    const cdnServer = createServer();
    const hub = new TestHub(hubServer, cdnServer);
    hubServer.on("request", (req, res) => void hub.handleHub(req, res));
    cdnServer.on("request", (req, res) => void hub.handleCdn(req, res));
    await Promise.all(
      [hubServer, cdnServer].map(
        (s) => new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r())),
      ),
    );
    return hub;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.hubServer.address() as AddressInfo).port}`;
  }

  get cdnUrl(): string {
    return `http://127.0.0.1:${(this.cdnServer.address() as AddressInfo).port}`;
  }

  async close(): Promise<void> {
    for (const s of [this.hubServer, this.cdnServer]) {
      s.closeAllConnections();
      await new Promise<void>((r) => s.close(() => r()));
    }
  }

  /** Adds a commit with these files to `repo` and points its branch at it; returns the commit. */
  addRepo(repo: string, files: Map<string, Buffer>, options: RepoOptions = {}): string {
    const isLfs =
      options.lfs ?? ((p: string) => p.endsWith(".safetensors") || p === "tokenizer.json");
    const stored = new Map<string, StoredFile>();
    const commitHash = createHash("sha1").update(`${repo}\0${this.commitCounter++}\0`);
    for (const [path, data] of [...files].sort((a, b) => a[0].localeCompare(b[0]))) {
      const f: StoredFile = {
        path,
        data,
        sha256: createHash("sha256").update(data).digest("hex"),
        blobId: gitBlobId(data),
        lfs: isLfs(path),
      };
      stored.set(path, f);
      if (f.lfs) this.lfsIndex.set(f.sha256, f);
      commitHash.update(`${path}\0${f.sha256}\0`);
    }
    const commit = commitHash.digest("hex");
    const r = this.repos.get(repo) ?? {
      commits: new Map(),
      refs: new Map(),
      token: null,
      info: {},
    };
    r.commits.set(commit, stored);
    r.refs.set(options.branch ?? "main", commit);
    if (options.token !== undefined) r.token = options.token;
    if (options.info !== undefined) r.info = options.info;
    this.repos.set(repo, r);
    return commit;
  }

  /** Adds every file of a local checkpoint directory (not recursive). */
  async addRepoFromDir(repo: string, dir: string, options: RepoOptions = {}): Promise<string> {
    const files = new Map<string, Buffer>();
    for (const e of await readdir(dir, { withFileTypes: true })) {
      if (e.isFile()) files.set(e.name, await readFile(join(dir, e.name)));
    }
    return this.addRepo(repo, files, options);
  }

  /** Bytes of the files of a commit (what a full download fetches). */
  repoBytes(repo: string, commit: string): number {
    let n = 0;
    for (const f of this.repos.get(repo)!.commits.get(commit)!.values()) n += f.data.length;
    return n;
  }

  private fault(
    on: Fault["on"],
    path: string,
    req: IncomingMessage,
    start: number | null,
  ): FaultAction | null {
    for (const f of this.faults) {
      if (f.on !== on) continue;
      if (
        f.path !== undefined &&
        !(typeof f.path === "string" ? f.path === path : f.path.test(path))
      )
        continue;
      const ranged = req.headers.range !== undefined;
      if (f.ranged !== undefined && f.ranged !== ranged) continue;
      if (f.minStart !== undefined && (start === null || start < f.minStart)) continue;
      f.seen = (f.seen ?? 0) + 1;
      if (f.seen <= (f.skip ?? 0)) continue;
      if (f.times !== undefined && f.seen > (f.skip ?? 0) + f.times) continue;
      return f.action;
    }
    return null;
  }

  private record(server: "hub" | "cdn", req: IncomingMessage, status: number): void {
    this.log.push({
      server,
      method: req.method ?? "",
      url: req.url ?? "",
      range: req.headers.range ?? null,
      status,
      authorization: req.headers.authorization !== undefined,
      t: Date.now(),
    });
  }

  private error(
    req: IncomingMessage,
    res: ServerResponse,
    status: number,
    code: string,
    message: string,
  ): void {
    this.record("hub", req, status);
    res.writeHead(status, {
      "content-type": "application/json",
      "x-error-code": code,
      "x-error-message": message,
    });
    res.end(req.method === "HEAD" ? undefined : JSON.stringify({ error: message }));
  }

  /** Splits `/a/b/rest` into a known repo id and the rest, trying `owner/name` then `name`. */
  private splitRepo(parts: string[]): { repo: string; rest: string[] } | null {
    for (const n of [2, 1]) {
      const repo = parts.slice(0, n).join("/");
      if (this.repos.has(repo) || this.renames.has(repo)) return { repo, rest: parts.slice(n) };
    }
    return null;
  }

  private async handleHub(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", this.url);
    const parts = url.pathname
      .split("/")
      .filter((p) => p !== "")
      .map(decodeURIComponent);
    const api = parts[0] === "api" && parts[1] === "models";
    if (api && parts.length === 2) {
      this.search(req, res, url);
      return;
    }
    const found = this.splitRepo(api ? parts.slice(2) : parts);
    if (!found) {
      this.error(req, res, 401, "RepoNotFound", "Repository not found");
      return;
    }
    const renamed = this.renames.get(found.repo);
    if (renamed) {
      const target = url.pathname.replace(`/${found.repo}/`, `/${renamed}/`) + url.search;
      this.record("hub", req, 307);
      res.writeHead(307, { location: target });
      res.end();
      return;
    }
    const repo = this.repos.get(found.repo)!;
    if (repo.token !== null) {
      const auth = req.headers.authorization;
      if (auth === undefined) {
        this.error(req, res, 401, "GatedRepo", "Access to this model is restricted");
        return;
      }
      if (auth !== `Bearer ${repo.token}`) {
        this.error(req, res, 403, "GatedRepo", "Access to this model is restricted");
        return;
      }
    }
    const [kind, rev, ...pathParts] = found.rest;
    const commit = rev === undefined ? undefined : (repo.refs.get(rev) ?? rev);
    const files = commit === undefined ? undefined : repo.commits.get(commit);
    if (api && kind === "revision") {
      if (!files) {
        this.error(req, res, 404, "RevisionNotFound", `Invalid rev id: ${rev}`);
        return;
      }
      const action = this.fault("api", "", req, null);
      if (action?.kind === "status") {
        this.record("hub", req, action.status);
        res.writeHead(action.status, action.retryAfter ? { "retry-after": action.retryAfter } : {});
        res.end();
        return;
      }
      if (action?.kind === "endless") {
        this.record("hub", req, 200);
        res.writeHead(200, { "content-type": "application/json" });
        res.write('{"id": "');
        const chunk = Buffer.alloc(64 * 1024, "a");
        const more = (): void => {
          while (!res.destroyed && res.write(chunk));
          if (!res.destroyed) res.once("drain", more);
        };
        res.on("close", () => res.removeAllListeners("drain"));
        more();
        return;
      }
      const claimed = (f: StoredFile): number =>
        action?.kind === "claim-size" && action.file === f.path ? action.size : f.data.length;
      const body = JSON.stringify({
        id: found.repo,
        sha: commit,
        siblings: [...files.values()].map((f) => ({
          rfilename: f.path,
          size: claimed(f),
          blobId: f.blobId,
          ...(f.lfs ? { lfs: { sha256: f.sha256, size: claimed(f), pointerSize: 134 } } : {}),
        })),
      });
      this.record("hub", req, 200);
      res.writeHead(200, { "content-type": "application/json" });
      res.end(body);
      return;
    }
    if (api || kind !== "resolve") {
      this.error(req, res, 404, "EntryNotFound", "Not found");
      return;
    }
    if (!files) {
      this.error(req, res, 404, "RevisionNotFound", `Invalid rev id: ${rev}`);
      return;
    }
    const path = pathParts.join("/");
    const file = files.get(path);
    if (!file) {
      this.error(req, res, 404, "EntryNotFound", `${path} does not exist`);
      return;
    }
    const action = this.fault("resolve", path, req, null);
    if (action?.kind === "redirect") {
      this.record("hub", req, 302);
      res.writeHead(302, { location: action.location, "x-repo-commit": commit! });
      res.end();
      return;
    }
    if (action?.kind === "status") {
      this.record("hub", req, action.status);
      res.writeHead(action.status, action.retryAfter ? { "retry-after": action.retryAfter } : {});
      res.end();
      return;
    }
    const commitHeader = action?.kind === "commit" ? action.commit : commit!;
    if (file.lfs) {
      this.record("hub", req, 302);
      res.writeHead(302, {
        location: `${this.cdnUrl}/lfs/${file.sha256}?expires=1`,
        "x-repo-commit": commitHeader,
        "x-linked-etag": `"${action?.kind === "linked-etag" ? action.etag : file.sha256}"`,
        "x-linked-size": String(file.data.length),
        etag: `"${createHash("sha1").update(file.sha256).digest("hex")}"`,
      });
      res.end();
      return;
    }
    await this.serveData(
      "hub",
      req,
      res,
      file,
      { "x-repo-commit": commitHeader },
      `"${file.blobId}"`,
    );
  }

  /** The model search: ids containing `search`, with every `filter` tag, by `sort`. */
  private search(req: IncomingMessage, res: ServerResponse, url: URL): void {
    const action = this.fault("api", "search", req, null);
    if (action?.kind === "status") {
      this.record("hub", req, action.status);
      res.writeHead(action.status, {
        "content-type": "application/json",
        ...(action.retryAfter ? { "retry-after": action.retryAfter } : {}),
      });
      res.end(JSON.stringify({ error: `status ${action.status}` }));
      return;
    }
    const q = (url.searchParams.get("search") ?? "").toLowerCase();
    const filters = url.searchParams.getAll("filter");
    const limit = Number(url.searchParams.get("limit") ?? "50");
    const items: Record<string, unknown>[] = [];
    for (const [id, repo] of this.repos) {
      if (!id.toLowerCase().includes(q)) continue;
      const commit = repo.refs.get("main") ?? [...repo.refs.values()][0]!;
      const files = repo.commits.get(commit)!;
      const info = repo.info;
      const tags = [...(info.tags ?? [])];
      if ([...files.keys()].some((p) => p.endsWith(".safetensors"))) tags.push("safetensors");
      if ([...files.keys()].some((p) => p.endsWith(".gguf"))) tags.push("gguf");
      if (!filters.every((f) => tags.includes(f))) continue;
      let config: Record<string, unknown> | undefined;
      const configFile = files.get("config.json");
      if (configFile) {
        try {
          const c = JSON.parse(configFile.data.toString("utf8")) as Record<string, unknown>;
          config = {
            ...(c.architectures !== undefined ? { architectures: c.architectures } : {}),
            ...(c.model_type !== undefined ? { model_type: c.model_type } : {}),
            ...(c.quantization_config !== undefined
              ? { quantization_config: c.quantization_config }
              : {}),
          };
        } catch {
          config = undefined;
        }
      }
      items.push({
        _id: createHash("sha1").update(id).digest("hex").slice(0, 24),
        id,
        author: id.includes("/") ? id.split("/")[0] : undefined,
        downloads: info.downloads ?? 0,
        likes: info.likes ?? 0,
        lastModified: "2026-11-01T00:00:00.000Z",
        private: false,
        gated: info.gated ?? (repo.token !== null ? "manual" : false),
        pipeline_tag: info.pipeline_tag ?? "text-generation",
        library_name: info.library_name,
        tags,
        cardData: info.cardData,
        config,
        sha: commit,
        siblings: [...files.keys()].map((rfilename) => ({ rfilename })),
      });
    }
    const sort = url.searchParams.get("sort");
    if (sort === "downloads" || sort === "likes") {
      items.sort((a, b) => (b[sort] as number) - (a[sort] as number));
    }
    this.record("hub", req, 200);
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(items.slice(0, limit)));
  }

  private async handleCdn(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.headers.authorization !== undefined) this.cdnSawAuthorization = true;
    const m = /^\/lfs\/([0-9a-f]{64})/.exec(req.url ?? "");
    const file = m ? this.lfsIndex.get(m[1]!) : undefined;
    if (!file) {
      this.record("cdn", req, 404);
      res.writeHead(404);
      res.end();
      return;
    }
    await this.serveData("cdn", req, res, file, {}, `"cdn-${file.sha256.slice(0, 16)}"`);
  }

  private async serveData(
    server: "hub" | "cdn",
    req: IncomingMessage,
    res: ServerResponse,
    file: StoredFile,
    extra: Record<string, string>,
    etag: string,
  ): Promise<void> {
    const size = file.data.length;
    const rangeHeader = req.headers.range;
    let start = 0;
    let end = size - 1;
    let ranged = false;
    let bad = false;
    if (rangeHeader !== undefined) {
      const m = /^bytes=(\d*)-(\d*)$/.exec(rangeHeader);
      if (!m || (m[1] === "" && m[2] === "")) bad = true;
      else if (m[1] === "") {
        start = Math.max(0, size - Number(m[2]));
      } else {
        start = Number(m[1]);
        if (m[2] !== "") end = Math.min(size - 1, Number(m[2]));
      }
      if (start >= size || start > end) bad = true;
      ranged = true;
    }
    const action = this.fault("data", file.path, req, ranged ? start : null);
    if (action?.kind === "ignore-range") {
      ranged = false;
      bad = false;
      start = 0;
      end = size - 1;
    }
    if (action?.kind === "status") {
      this.record(server, req, action.status);
      const h: Record<string, string> = { ...extra };
      if (action.retryAfter !== undefined) h["retry-after"] = action.retryAfter;
      if (action.contentRange !== undefined) h["content-range"] = action.contentRange;
      res.writeHead(action.status, h);
      res.end();
      return;
    }
    if (bad) {
      this.record(server, req, 416);
      res.writeHead(416, { ...extra, "content-range": `bytes */${size}` });
      res.end();
      return;
    }
    let body = file.data.subarray(start, end + 1);
    if (action?.kind === "alter" && body.length > 0) {
      body = Buffer.from(body);
      const at = Math.min(body.length - 1, action.at ?? Math.floor(body.length / 2));
      body[at]! ^= 0x5a;
    }
    const status = ranged ? 206 : 200;
    this.record(server, req, status);
    res.writeHead(status, {
      ...extra,
      "accept-ranges": "bytes",
      "content-length": String(body.length),
      "content-type": "application/octet-stream",
      etag: action?.kind === "etag" ? `"${action.etag}"` : etag,
      ...(ranged ? { "content-range": `bytes ${start}-${end}/${size}` } : {}),
    });
    if (req.method === "HEAD") {
      res.end();
      return;
    }
    const send = (chunk: Buffer): boolean => {
      this.dataBytes += chunk.length;
      return res.write(chunk);
    };
    const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
    if (action?.kind === "drop") {
      send(body.subarray(0, Math.min(action.afterBytes, body.length)));
      await sleep(5);
      res.socket?.destroy();
      return;
    }
    if (action?.kind === "trickle" || action?.kind === "stall") {
      const pieces: Buffer[] = [];
      if (action.kind === "trickle") {
        for (let i = 0; i < body.length; i += action.chunkBytes)
          pieces.push(body.subarray(i, i + action.chunkBytes));
      } else {
        pieces.push(body.subarray(0, action.afterBytes), body.subarray(action.afterBytes));
      }
      for (let i = 0; i < pieces.length; i++) {
        if (res.destroyed || res.socket?.destroyed) return;
        if (i > 0) await sleep(action.kind === "trickle" ? action.delayMs : action.ms);
        if (res.destroyed || res.socket?.destroyed) return;
        send(pieces[i]!);
      }
      res.end();
      return;
    }
    // Large bodies in pieces, respecting backpressure.
    const piece = 1 << 20;
    for (let i = 0; i < body.length; i += piece) {
      if (res.destroyed) return;
      if (!send(body.subarray(i, i + piece))) {
        await new Promise<void>((r) => {
          const done = (): void => {
            res.off("drain", done);
            res.off("close", done);
            r();
          };
          res.on("drain", done);
          res.on("close", done);
        });
      }
    }
    res.end();
  }
}
