/**
 * Assistant replies as markdown: GitHub-flavoured (tables, task lists) with highlighted code.
 * Raw HTML in a reply is never rendered (react-markdown escapes it without rehype-raw) and link
 * URLs go through react-markdown's default transform, which drops `javascript:` and the like.
 * Highlighting only applies to fenced blocks that name their language: guessing is slow on long
 * replies and often wrong.
 */
import { memo, useRef, type ComponentPropsWithoutRef } from "react";
import ReactMarkdown, { type Components } from "react-markdown";
import rehypeHighlight from "rehype-highlight";
import remarkGfm from "remark-gfm";
import { CopyButton } from "../components/CopyButton.tsx";

const remarkPlugins = [remarkGfm];
const rehypePlugins = [rehypeHighlight];

function CodeBlock({
  children,
  node: _node,
  ...rest
}: ComponentPropsWithoutRef<"pre"> & { node?: unknown }) {
  const ref = useRef<HTMLPreElement>(null);
  return (
    <div className="code-block group relative my-2">
      <div className="absolute top-1 right-1 flex items-center gap-1">
        <CopyButton
          label="Copy code"
          getText={() => ref.current?.textContent ?? ""}
          className="bg-code text-code-fg hover:bg-white/10"
        />
      </div>
      <pre ref={ref} {...rest}>
        {children}
      </pre>
    </div>
  );
}

function Link({
  children,
  node: _node,
  ...rest
}: ComponentPropsWithoutRef<"a"> & { node?: unknown }) {
  return (
    <a {...rest} target="_blank" rel="noreferrer noopener">
      {children}
    </a>
  );
}

const components: Components = { pre: CodeBlock, a: Link };

export const Markdown = memo(function Markdown({ text }: { text: string }) {
  return (
    <div className="markdown">
      <ReactMarkdown
        remarkPlugins={remarkPlugins}
        rehypePlugins={rehypePlugins}
        components={components}
      >
        {text}
      </ReactMarkdown>
    </div>
  );
});
