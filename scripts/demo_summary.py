"""make demo: the copy prompt's reply and speed with prompt lookup on and off, from two `mlx-generate --json` files.

Run: .venv/bin/python scripts/demo_summary.py ON.json OFF.json   (exits 1 if the two replies differ)
"""

from __future__ import annotations

import json
import sys


def main(on_path: str, off_path: str) -> int:
    on, off = (json.load(open(path)) for path in (on_path, off_path))
    print(on["text"])
    for name, reply in (("on ", on), ("off", off)):
        t = reply["timings"]
        drafts = f", {t['draft_n_accepted']} of {t['draft_n']} drafted tokens accepted" if t.get("draft_kind") else ""
        print(f"prompt lookup {name}: {t['predicted_n']} tokens at {t['predicted_per_second']:.1f} tok/s{drafts}")
    speedup = on["timings"]["predicted_per_second"] / off["timings"]["predicted_per_second"]
    same = on["tokens"] == off["tokens"]
    print(
        f"speed-up {speedup:.2f}x; replies identical: {'yes' if same else 'NO'} "
        f"({len(on['tokens'])} vs {len(off['tokens'])} tokens)"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
