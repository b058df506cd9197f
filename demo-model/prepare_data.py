#!/usr/bin/env python3
"""Build the demo model's training and held-out text from Debian's public-domain packages.

Sources (read offline, nothing is downloaded):
  - the King James Bible: Debian packages bible-kjv-text (the data) and bible-kjv (the `bible`
    program that decodes it): `bible -f Gen1:1-Rev22:21`, one verse a line
  - fortune cookies: Debian packages fortunes-min and fortunes (/usr/share/games/fortunes/*,
    a selection of the collections, see FORTUNE_FILES)

Writes to --out:
  train.jsonl          {"kind", "text"} documents: plain Bible chapters, fortunes, and chat
                       turns rendered exactly as core/models/gemma4.jinja renders them
                       (<bos><|turn>user\\n...<turn|>\\n<|turn>model\\n<|channel>thought\\n<channel|>...<turn|>\\n)
  heldout.jsonl        held-out documents (chapters and fortunes never trained on)
  heldout.txt          a plain-text slice of the held-out chapters (the perplexity test's file)
  data.json            counts, sources, package versions, seed, sha256 of every file

Deterministic: the same packages and --seed give the same bytes.

    python3 demo-model/prepare_data.py --out /tmp/demo-data
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess

BOOKS = {
    "Ge": "Genesis", "Exo": "Exodus", "Lev": "Leviticus", "Num": "Numbers", "Deu": "Deuteronomy",
    "Josh": "Joshua", "Jdgs": "Judges", "Ruth": "Ruth", "1Sm": "1 Samuel", "2Sm": "2 Samuel",
    "1Ki": "1 Kings", "2Ki": "2 Kings", "1Chr": "1 Chronicles", "2Chr": "2 Chronicles",
    "Ezra": "Ezra", "Neh": "Nehemiah", "Est": "Esther", "Job": "Job", "Psa": "Psalms",
    "Prv": "Proverbs", "Eccl": "Ecclesiastes", "SSol": "Song of Solomon", "Isa": "Isaiah",
    "Jer": "Jeremiah", "Lam": "Lamentations", "Eze": "Ezekiel", "Dan": "Daniel", "Hos": "Hosea",
    "Joel": "Joel", "Amos": "Amos", "Obad": "Obadiah", "Jonah": "Jonah", "Mic": "Micah",
    "Nahum": "Nahum", "Hab": "Habakkuk", "Zep": "Zephaniah", "Hag": "Haggai", "Zec": "Zechariah",
    "Mal": "Malachi", "Mat": "Matthew", "Mark": "Mark", "Luke": "Luke", "John": "John",
    "Acts": "Acts", "Rom": "Romans", "1Cor": "1 Corinthians", "2Cor": "2 Corinthians",
    "Gal": "Galatians", "Eph": "Ephesians", "Phi": "Philippians", "Col": "Colossians",
    "1Th": "1 Thessalonians", "2Th": "2 Thessalonians", "1Tim": "1 Timothy", "2Tim": "2 Timothy",
    "Titus": "Titus", "Phmn": "Philemon", "Heb": "Hebrews", "Jas": "James", "1Pet": "1 Peter",
    "2Pet": "2 Peter", "1Jn": "1 John", "2Jn": "2 John", "3Jn": "3 John", "Jude": "Jude",
    "Rev": "Revelation",
}

# Collections of the fortunes packages used; left out: ASCII art, IRC logs, collections of
# ethnic, political, drug or gender jokes, and other people's signatures.
FORTUNE_DIR = "/usr/share/games/fortunes"
FORTUNE_FILES = [
    "fortunes", "computers", "cookie", "definitions", "education", "food", "goedel", "humorists",
    "kids", "law", "literature", "love", "magic", "medicine", "miscellaneous", "news",
    "paradoxum", "people", "pets", "platitudes", "riddles", "science", "songs-poems", "sports",
    "wisdom", "work",
]

# Chapters always trained on (the demo's example prompts quote them), never held out.
KEEP_IN_TRAINING = {("Genesis", 1), ("Genesis", 2), ("Genesis", 3), ("Psalms", 23), ("John", 1), ("John", 3)}
# Verses quoted more often (a small model memorizes what it sees often).
FAMOUS_CHAPTERS = KEEP_IN_TRAINING

STOPWORDS = set(
    """a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    one two three unto shall thee thou thy thine hath said saith upon things thing every never
    always ever much many like well make made know knows get gets got come came went goes going
    want wants let lets may might must yet still even though whose""".split()
)

BOS = "<bos>"
GEN_PROMPT = "<|turn>model\n<|channel>thought\n<channel|>"


def chat(user: str, reply: str) -> str:
    """One exchange exactly as core/models/gemma4.jinja renders it (no system turn,
    thinking off, so the generation prompt carries the empty thought channel), followed by the
    reply and its end-of-turn token."""
    return f"{BOS}<|turn>user\n{user.strip()}<turn|>\n{GEN_PROMPT}{reply.strip()}<turn|>\n"


def read_bible() -> list[tuple[str, int, int, str]]:
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True).stdout
    verses = []
    for line in out.splitlines():
        m = re.match(r"^(\S+?)(\d+):(\d+) (.*)$", line)
        if not m:
            raise ValueError(f"unexpected line from bible: {line!r}")
        abbr, ch, vs, text = m.groups()
        verses.append((BOOKS[abbr], int(ch), int(vs), text.strip()))
    if len(verses) != 31102:
        raise ValueError(f"expected 31102 verses, got {len(verses)}")
    return verses


def read_fortunes() -> list[tuple[str, str]]:
    out = []
    for name in FORTUNE_FILES:
        with open(os.path.join(FORTUNE_DIR, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for item in text.split("\n%\n"):
            item = item.strip("%\n").rstrip()
            if not item.strip() or len(item) > 500 or "\ufffd" in item:
                continue
            # Tabs and runs of spaces are layout (poems, attributions): keep newlines, tidy the rest.
            item = "\n".join(re.sub(r"[ \t]+", " ", line).strip() for line in item.splitlines())
            if sum(c.isascii() for c in item) < 0.98 * len(item):
                continue
            out.append((name, item.strip()))
    return out


def package_version(pkg: str) -> str:
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def keywords(text: str) -> list[str]:
    words = re.findall(r"[A-Za-z]{4,}", text)
    return sorted({w.lower() for w in words if w.lower() not in STOPWORDS})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--heldout-fraction", type=float, default=0.02)
    ap.add_argument("--heldout-text-chars", type=int, default=6000, help="size of heldout.txt")
    ap.add_argument("--quote-pairs", type=int, default=40000)
    ap.add_argument("--fortune-pairs", type=int, default=25000)
    ap.add_argument("--continue-pairs", type=int, default=25000)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)

    verses = read_bible()
    chapters: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for book, ch, vs, text in verses:
        chapters.setdefault((book, ch), []).append((vs, text))
    keys = list(chapters)
    candidates = [k for k in keys if k not in KEEP_IN_TRAINING]
    held_chapters = set(rng.sample(candidates, round(args.heldout_fraction * len(keys))))

    fortunes = read_fortunes()
    order = list(range(len(fortunes)))
    rng.shuffle(order)
    n_held_f = round(args.heldout_fraction * len(fortunes))
    held_f = set(order[:n_held_f])

    def chapter_text(key) -> str:
        book, ch = key
        return "".join(f"{book} {ch}:{vs} {text}\n" for vs, text in chapters[key])

    train, held = [], []
    for key in keys:
        doc = {"kind": "bible", "text": BOS + chapter_text(key)}
        (held if key in held_chapters else train).append(doc)
    for i, (coll, text) in enumerate(fortunes):
        doc = {"kind": "fortune", "text": BOS + text + "\n"}
        (held if i in held_f else train).append(doc)

    train_verses = [(b, c, v, t) for b, c, v, t in verses if (b, c) not in held_chapters]
    famous = [x for x in train_verses if (x[0], x[1]) in FAMOUS_CHAPTERS]
    quote_forms = ["Quote {r}", "Quote {r}.", "What does {r} say?", "Recite {r}", "Give me {r}", "Quote {r} from the Bible"]
    for i in range(args.quote_pairs):
        b, c, v, t = rng.choice(famous) if i % 4 == 0 else rng.choice(train_verses)
        ref = f"{b} {c}:{v}"
        train.append({"kind": "chat-quote", "text": chat(rng.choice(quote_forms).format(r=ref), t)})

    index_of = {(b, c, v): i for i, (b, c, v, _) in enumerate(verses)}
    continue_forms = ["Continue: {s}", "Continue: {s}...", "Continue the verse: {s}", "Finish this: {s}"]
    for i in range(args.continue_pairs):
        b, c, v, t = rng.choice(famous) if i % 4 == 0 else rng.choice(train_verses)
        words = t.split()
        if len(words) < 6:
            continue
        cut = rng.randint(3, min(8, len(words) - 2))
        rest = " ".join(words[cut:])
        nxt = index_of[(b, c, v)] + 1
        if nxt < len(verses) and (verses[nxt][0], verses[nxt][1]) == (b, c):
            rest += " " + verses[nxt][3]
        train.append({"kind": "chat-continue", "text": chat(rng.choice(continue_forms).format(s=" ".join(words[:cut])), rest)})

    train_fortunes = [text for i, (_, text) in enumerate(fortunes) if i not in held_f]
    by_word: dict[str, list[str]] = {}
    for text in train_fortunes:
        for w in keywords(text):
            by_word.setdefault(w, []).append(text)
    # Topics with a few fortunes each; plural/singular prompts ("cats" and "cat") both occur.
    topics = sorted(w for w, lst in by_word.items() if len(lst) >= 3)
    fortune_forms = ["Tell me a fortune about {w}", "Tell me a fortune about {w}.", "Give me a fortune about {w}", "A fortune about {w}, please"]
    plain_forms = ["Tell me a fortune", "Tell me a fortune.", "Give me a fortune", "Fortune, please", "Tell me something wise"]
    for i in range(args.fortune_pairs):
        if i % 5 == 0:
            train.append({"kind": "chat-fortune", "text": chat(rng.choice(plain_forms), rng.choice(train_fortunes))})
            continue
        w = rng.choice(topics)
        train.append({"kind": "chat-fortune", "text": chat(rng.choice(fortune_forms).format(w=w), rng.choice(by_word[w]))})

    rng.shuffle(train)
    with open(os.path.join(args.out, "train.jsonl"), "w", encoding="utf-8") as f:
        for d in train:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    with open(os.path.join(args.out, "heldout.jsonl"), "w", encoding="utf-8") as f:
        for d in held:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")

    # heldout.txt: whole held-out chapters, in book order, until the size is reached; plain text
    # (the perplexity command adds <bos> itself).
    text = ""
    for key in keys:
        if key in held_chapters:
            text += chapter_text(key)
            if len(text) >= args.heldout_text_chars:
                break
    lines = text.splitlines(keepends=True)
    while len("".join(lines)) > args.heldout_text_chars and len(lines) > 1:
        lines.pop()
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write("".join(lines))

    counts: dict[str, int] = {}
    for d in train:
        counts[d["kind"]] = counts.get(d["kind"], 0) + 1
    files = {}
    for name in ("train.jsonl", "heldout.jsonl", "heldout.txt"):
        with open(os.path.join(args.out, name), "rb") as f:
            files[name] = hashlib.sha256(f.read()).hexdigest()
    info = {
        "seed": args.seed,
        "sources": {
            "bible-kjv-text": package_version("bible-kjv-text"),
            "bible-kjv": package_version("bible-kjv"),
            "fortunes": package_version("fortunes"),
            "fortunes-min": package_version("fortunes-min"),
            "fortune_files": FORTUNE_FILES,
        },
        "verses": len(verses),
        "chapters": len(keys),
        "heldout_chapters": sorted(f"{b} {c}" for b, c in held_chapters),
        "fortunes": len(fortunes),
        "heldout_fortunes": n_held_f,
        "train_documents": counts,
        "heldout_documents": len(held),
        "fortune_topics": len(topics),
        "sha256": files,
        "command": "python3 demo-model/prepare_data.py --out DIR" + (f" --seed {args.seed}" if args.seed != 16 else ""),
    }
    with open(os.path.join(args.out, "data.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    print(json.dumps({k: info[k] for k in ("verses", "chapters", "fortunes", "train_documents", "heldout_documents", "fortune_topics")}))


if __name__ == "__main__":
    main()
