"""Prepare the examples' default data on the host: scikit-learn's handwritten digits.

    python examples/prepare_data.py DATA_DIR

writes DATA_DIR/digits.npz (a fixed train/test split). tflab ships the file this script
wrote (examples/data/digits.npz, written into a lab's data/ by `tflab gen`); run it only to
make it again (it needs scikit-learn on the host). Put real MNIST files in DATA_DIR
instead (train-images-idx3-ubyte[.gz] and the three others, or mnist.npz) and the
examples use those.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "data")
    target.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images.astype(np.uint8), digits.target, test_size=0.2, random_state=0,
        stratify=digits.target,
    )
    np.savez_compressed(target / "digits.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    print(f"wrote {target / 'digits.npz'}: {len(x_train)} training and {len(x_test)} test digits")


if __name__ == "__main__":
    main()
