/**
 * The app's connections (core/connections): the saved OpenAI-compatible endpoints with the
 * model list each answered last, for the Connections view and the Chat model picker. Listing
 * failures are kept with the connection (shown next to it), never thrown at start-up; keys stay
 * in the main process.
 */
import { listModels } from "../connections/client.ts";
import type { SecretBox } from "../connections/secrets.ts";
import {
  ConnectionStore,
  type ConnectionInput,
  type ConnectionView,
  type Endpoint,
} from "../connections/store.ts";
import type { AppError, Connection } from "./api.ts";
import { toAppError } from "./errors.ts";

/** How long listing an endpoint's models may take in the background. */
const LIST_TIMEOUT_MS = 10_000;

export interface ConnectionsManagerOptions {
  dataDir: string;
  secretBox: SecretBox | null;
  notice: (text: string) => void;
  onChange: (connections: Connection[]) => void;
  listTimeoutMs?: number;
}

export class ConnectionsManager {
  private readonly store: Promise<ConnectionStore>;
  private readonly listed = new Map<string, { models: string[] | null; error: AppError | null }>();

  constructor(private readonly opts: ConnectionsManagerOptions) {
    this.store = ConnectionStore.open(opts.dataDir, {
      secretBox: opts.secretBox,
      notice: opts.notice,
    });
    // An unreadable file must not become an unhandled rejection before the first call.
    this.store.catch(() => undefined);
  }

  private view(c: ConnectionView): Connection {
    const listed = this.listed.get(c.id);
    return { ...c, models: listed?.models ?? null, error: listed?.error ?? null };
  }

  async list(): Promise<Connection[]> {
    return (await this.store).list().map((c) => this.view(c));
  }

  async get(id: string): Promise<Connection> {
    return this.view((await this.store).get(id));
  }

  /** The endpoint with its key, for the client. */
  async endpoint(id: string): Promise<Endpoint> {
    return (await this.store).endpoint(id);
  }

  async add(input: ConnectionInput): Promise<Connection> {
    const c = await (await this.store).add(input);
    await this.refresh(c.id);
    return this.get(c.id);
  }

  async update(id: string, patch: Partial<ConnectionInput>): Promise<Connection> {
    await (await this.store).update(id, patch);
    await this.refresh(id);
    return this.get(id);
  }

  async remove(id: string): Promise<void> {
    await (await this.store).remove(id);
    this.listed.delete(id);
    await this.announce();
  }

  /** Lists the endpoint's models again; the outcome (models or error) is kept and announced. */
  async refresh(id: string): Promise<Connection> {
    let outcome: { models: string[] | null; error: AppError | null };
    try {
      const models = await listModels(await this.endpoint(id), {
        timeoutMs: this.opts.listTimeoutMs ?? LIST_TIMEOUT_MS,
      });
      outcome = { models: models.map((m) => m.id), error: null };
    } catch (error) {
      outcome = { models: this.listed.get(id)?.models ?? null, error: toAppError(error) };
    }
    this.listed.set(id, outcome);
    await this.announce();
    return this.get(id);
  }

  /** Lists every endpoint's models (at start), in the background. */
  async refreshAll(): Promise<void> {
    const all = (await this.store).list();
    await Promise.all(all.map((c) => this.refresh(c.id)));
  }

  private async announce(): Promise<void> {
    this.opts.onChange(await this.list());
  }
}
