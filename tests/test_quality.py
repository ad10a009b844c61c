"""Quality read from what programs print (issue 37): the examples', Keras', TF1 hooks', a task's own; time to a target."""

from __future__ import annotations

import re

import pytest

from tflab.plan import quality

LINES = [
    ("worker0: test accuracy 0.9722", {"accuracy": 0.9722}),
    ("worker2: final loss 0.031318 test accuracy 0.9694", {"accuracy": 0.9694, "loss": 0.031318}),
    ("worker0: global step 300 loss 0.0265 accuracy 0.9100 (49.3 steps/s here)", {"loss": 0.0265, "accuracy": 0.91}),
    ("469/469 - 2s - 4ms/step - accuracy: 0.9531 - loss: 0.1234 - val_accuracy: 0.9500 - val_loss: 0.1500",
     {"accuracy": 0.9531, "loss": 0.1234, "val_accuracy": 0.95, "val_loss": 0.15}),
    ("120/469 [=====>....] - ETA: 1s - loss: 0.4012 - acc: 0.8807", {"loss": 0.4012, "accuracy": 0.8807}),
    ("INFO:tensorflow:loss = 0.123, step = 300 (0.5 sec)", {"loss": 0.123}),
    # the corpus (tests/corpus): TensorFlow's parameter-server tutorial, Kubeflow's dist-mnist
    ("Finished epoch 3, accuracy is 1.000000.", {"accuracy": 1.0}),
    ("Evaluation accuracy: 0.962000", {"accuracy": 0.962}),
    ("Epoch: 2, accuracy: 0.987723, train_loss: 0.048340.", {"accuracy": 0.987723}),
    ("worker0: first step done (global step 0)", {}),
    ("max_loss: nan", {}),
    ("learning_rate 0.1 val_loss_scale 2", {}),
]


@pytest.mark.parametrize("line,expected", LINES)
def test_what_programs_print_is_read_as_numbers(line: str, expected: dict) -> None:
    assert quality.read(line) == expected


def test_a_tasks_own_pattern_names_its_metric() -> None:
    own = re.compile(r"iter (?P<step>\d+) f1=(?P<f1>[0-9.]+)")
    assert quality.read("iter 40 f1=0.81", own) == {"f1": 0.81}
    own = re.compile(r"score (?P<quality>[0-9.]+)")
    assert quality.read("score 0.5", own) == {"quality": 0.5}


def test_time_to_a_target_is_the_first_time_it_was_reached() -> None:
    series = [[1.0, 0.5], [2.5, 0.93], [4.0, 0.96], [5.0, 0.94]]
    assert quality.time_to(series, "accuracy", 0.95) == 4.0
    assert quality.time_to(series, "accuracy", 0.99) is None
    assert quality.time_to([[1.0, 0.9], [3.0, 0.2]], "loss", 0.3) == 3.0


def test_a_target_is_metric_equals_value() -> None:
    assert quality.parse_target("accuracy=0.95") == ("accuracy", 0.95)
    for bad in ("accuracy", "=0.9", "accuracy=high", "acc uracy=1", "loss=nan"):
        with pytest.raises(ValueError, match="METRIC=VALUE"):
            quality.parse_target(bad)


def test_a_long_series_is_thinned_keeping_its_last_point() -> None:
    series = [[float(i), float(i)] for i in range(1000)]
    while len(series) > quality.MAX_SERIES:
        series = quality.thin(series)
    assert series[-1] == [999.0, 999.0] and series[0] == [0.0, 0.0]
