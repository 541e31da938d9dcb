"""Byte-level scrub of machine paths from captured fixtures (keeps \\r, \\n and all other bytes).

Usage: python scrub.py RAW_IN OUT [--max-bytes N] [--path DIR=PLACEHOLDER ...] [--map REGEX=PLACEHOLDER ...]
``--path`` replaces a literal path, ``--map`` a regex (on bytes); rules apply in the order given, so
give the longest (innermost) paths first. capture.sh maps: raw capture dir -> <raw>, trainer output
dir -> <run_dir>, inductor cache dirs -> <inductor_cache>, the venv -> <venv>, the staging folder the
commands run from -> <fixtures> (so the capture scripts read as <fixtures>/scripts/..., as in the
kept captures).
If --max-bytes is given and the file is bigger, the middle is cut and replaced by one marker line.
Exits non-zero (2) if an absolute temp or home path remains.
"""
import re
import sys


def parse(argv):
    """(src, dst, max_bytes, rules) from argv; rules are (compiled bytes regex, replacement bytes)."""
    pos, rules, max_bytes = [], [], None
    it = iter(argv)
    for a in it:
        if a in ("--map", "--path"):
            pat, _, rep = next(it).partition("=")
            pat_b = pat.encode()
            rules.append((re.compile(re.escape(pat_b) if a == "--path" else pat_b), rep.encode()))
        elif a == "--max-bytes":
            max_bytes = int(next(it))
        else:
            pos.append(a)
    if len(pos) != 2:
        sys.exit(__doc__)
    return pos[0], pos[1], max_bytes, rules


def scrub(data: bytes, rules) -> bytes:
    for pat, rep in rules:
        data = pat.sub(lambda _m, rep=rep: rep, data)
    return data


def main():
    src, dst, max_bytes, rules = parse(sys.argv[1:])
    with open(src, "rb") as f:
        data = scrub(f.read(), rules)
    if max_bytes and len(data) > max_bytes:
        half = max_bytes // 2
        head = data[:half]
        tail = data[-half:]
        # cut on line boundaries
        head = head[: head.rfind(b"\n") + 1]
        tail = tail[tail.find(b"\n") + 1 :]
        cut = len(data) - len(head) - len(tail)
        data = head + b"[... fixture truncated: %d bytes removed from the middle ...]\n" % cut + tail
    left = re.findall(rb"(/tmp/|/home/|/root/)", data)
    with open(dst, "wb") as f:
        f.write(data)
    if left:
        print("REMAINING PATHS in %s: %d" % (dst, len(left)), file=sys.stderr)
        sys.exit(2)
    print("ok %s (%d bytes)" % (dst, len(data)))


if __name__ == "__main__":
    main()
