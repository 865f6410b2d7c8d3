"""Evaluate the released toy checkpoint against the held-out labels.

Prints one JSON document on stdout: {"accuracy": ..., "correct": ..., "total": ...}.
"""

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--labels", type=Path, default=Path(__file__).with_name("labels.txt"))
    args = parser.parse_args()

    predictions = json.loads(args.checkpoint.read_text())["predictions"]
    labels = args.labels.read_text().strip()
    if len(predictions) != len(labels):
        raise SystemExit(f"{len(predictions)} predictions for {len(labels)} labels")
    correct = sum(p == t for p, t in zip(predictions, labels, strict=True))
    print(json.dumps({"accuracy": correct / len(labels), "correct": correct, "total": len(labels)}))


if __name__ == "__main__":
    main()
