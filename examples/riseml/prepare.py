"""The first line of examples/riseml/riseml.yml: every process checks that the training data loads and makes
the checkpoint directory, before any process starts training (the launcher's barrier between lines).

It is a plain command, not a Horovod program: it reads its rank from the ``HOROVOD_*`` variables that
``horovodrun --job`` gives every process.
"""
from __future__ import annotations

import argparse
import os
import socket

from sklearn.datasets import load_digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    args = parser.parse_args()
    rank, size = os.environ.get("HOROVOD_RANK", "0"), os.environ.get("HOROVOD_SIZE", "1")
    images = load_digits().images
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    print(f"process {rank} of {size} on {socket.gethostname()}: {len(images)} digit images ready, "
          f"checkpoints go to {args.checkpoint_dir}/", flush=True)


if __name__ == "__main__":
    main()
