import "./zod-config.ts";
import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import { App } from "./App.tsx";
import { createClient } from "./api/client.ts";
import "./styles.css";

const root = createRoot(document.getElementById("root")!);

createClient().then(
  (client) => {
    root.render(
      <StrictMode>
        <App client={client} />
      </StrictMode>,
    );
  },
  (e: unknown) => {
    root.render(
      <p role="alert" className="p-6">
        Redwing could not start its interface: {e instanceof Error ? e.message : String(e)}
      </p>,
    );
  },
);
