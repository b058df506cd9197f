"""Renders the Gemma 4 chat-template test vectors with Python's Jinja2, configured the way
Hugging Face transformers renders chat templates (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, raise_exception). This is the independent reference for the
expected strings in gemma4-vectors.json, which core/chat/template.test.ts checks both Redwing's
fallback template and Google's template text against.

    python3 core/chat/testdata/gemma4_vectors.py          # check the stored expected strings
    python3 core/chat/testdata/gemma4_vectors.py --write  # (re)write them, then:
    npx prettier --write core/chat/testdata/gemma4-vectors.json

Needs only jinja2 (pip install jinja2); npm test does not run it.
"""

import json
import sys
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = Path(__file__).parent
VECTORS = HERE / "gemma4-vectors.json"


def raise_exception(message):
    raise TemplateError(message)


def render(template_text, vector, bos):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    context = {
        "messages": vector["messages"],
        "bos_token": bos,
        "add_generation_prompt": vector["add_generation_prompt"],
        "enable_thinking": vector["enable_thinking"],
    }
    if vector.get("tools"):
        context["tools"] = vector["tools"]
    return env.from_string(template_text).render(**context)


def main():
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    template_text = (HERE / data["template"]).read_text(encoding="utf-8")
    failures = 0
    for vector in data["vectors"]:
        got = render(template_text, vector, data["bos_token"])
        if "--write" in sys.argv:
            vector["expected"] = got
        elif vector.get("expected") != got:
            failures += 1
            print(f"MISMATCH {vector['name']}\n  stored: {vector.get('expected')!r}\n  jinja2: {got!r}")
    if "--write" in sys.argv:
        VECTORS.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(data['vectors'])} vectors, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
