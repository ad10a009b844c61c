"""Training progress from the lines programs really print (literal lines), and a task's own pattern."""

from __future__ import annotations

from pathlib import Path

import pytest

from tflab.errors import UserError
from tflab.plan import taskfile
from tflab.plan.progress import ProgressReader, Reading, node_rate, rate


@pytest.mark.parametrize(("line", "reading"), [
    # tflab's examples and most hand-written loops
    ("worker0: global step 201 loss 0.0859 (46.6 steps/s here)", Reading(global_step=201)),
    ("worker0: step 120 (global step 310) loss 0.0859", Reading(step=120, global_step=310)),
    # a between-graph trainer's line: its own step, and the cluster's
    ("1512345678.9: Worker 1: training step 232 done (global step: 200)", Reading(step=232, global_step=200)),
    ("INFO:tensorflow:global_step: 42", Reading(global_step=42)),
    # a benchmark's rows (tf_cnn_benchmarks): its own step, and the images it moved
    ("10\timages/sec: 150.7 +/- 4.3 (jitter = 5.1)\t7.402", Reading(step=10)),
    ("100  images/sec: 148.2 +/- 1.1 (jitter = 4.0)  6.918", Reading(step=100)),
    ("total images/sec: 148.18", None),
    ("step=5 loss=0.3", Reading(step=5)),
    # the classic books' flag-style distributed programs
    ("After 100 training steps (100 global steps), loss on training batch is 0.71", Reading(step=100, global_step=100)),
    ("After 1001 training steps (2954 global steps), loss on training batch is 0.0466. (0.011 sec/batch)",
     Reading(step=1001, global_step=2954)),
    ("After 1 training step (1 global step), loss on training batch is 2.31", Reading(step=1, global_step=1)),
    # TF1's hooks, through tf.compat.v1.logging: the cluster's rate
    ("INFO:tensorflow:global_step/sec: 123.4", Reading(global_rate=123.4)),
    ("I1124 07:20:00.123 140 basic_session_run_hooks.py:692] global_step/sec: 98.5", Reading(global_rate=98.5)),
    ("INFO:tensorflow:loss = 0.1, step = 300 (0.807 sec)", Reading(step=300)),
    # not progress
    ("data: digits, 1437 training and 360 test examples of 64 features", None),
    ("WARNING:tensorflow:From train.py:12: StopAtStepHook", None),
    # a counter with no `Epoch` line before it: a fit of one epoch (Keras prints no `Epoch 1/1`); an `evaluate`
    # alone reads so too, one after a fit does not (it goes back, or counts another total: below)
    ("8/8 - 0s - 11ms/step", Reading(step=8)),
    # other steps than the training's (issue 30.4)
    ("INFO:tensorflow:Loss for final step: 0.25.", None),
    ("Skipping step 5", None),
    ("max step: 1000", None),
    ("Evaluation step: 3 of 100", None),
    ("step: 0.001 learning rate", None),
    ("Step 12/100: loss 3.1", Reading(step=12)),
])
def test_single_lines(line: str, reading: Reading | None) -> None:
    assert ProgressReader().read(line) == reading


def test_keras_epochs_and_progress_bars_count_every_batch() -> None:
    reader = ProgressReader()
    lines = [
        "Epoch 1/5",
        "  1/469 [..............................] - ETA: 4:21 - loss: 2.3",
        "469/469 [==============================] - 3s 6ms/step - loss: 0.35 - accuracy: 0.9",
        "Epoch 2/5",
        "120/469 [=====>........................] - ETA: 2s - loss: 0.21",
    ]
    assert [reader.read(line) for line in lines] == [
        None, Reading(step=1), Reading(step=469), None, Reading(step=469 + 120)]
    keras3 = ProgressReader()
    assert keras3.read("Epoch 3/5") is None
    assert keras3.read(" 10/100 ━━━━━━━━━━━━━━━━━━━━ 0s 7ms/step - accuracy: 0.81 - loss: 0.62") == Reading(step=210)


def test_the_corpus_programs_lines_give_their_steps() -> None:
    """What the corpus's programs (tests/corpus) print: the custom loops' epochs where they say nothing finer, and a
    fit of one epoch, which Keras prints without an `Epoch 1/1` line (lines as they printed them in a lab here)."""
    ctl = ProgressReader()  # tensorflow/docs multi_worker_with_ctl
    assert [ctl.read(f"Epoch: {n}, accuracy: 0.969196, train_loss: 0.106512.") for n in range(3)] == [
        Reading(step=0), Reading(step=1), Reading(step=2)]
    ps = ProgressReader()  # tensorflow/docs parameter_server_training: Model.fit's epochs, then a custom loop's
    assert ps.read("Epoch 1/5") is None
    assert ps.read("20/20 - 4s - loss: 0.6911 - 4s/epoch - 213ms/step") == Reading(step=20)
    assert ps.read("Finished epoch 0, accuracy is 0.562500.") is None, "once steps are counted, epochs are not"
    custom = ProgressReader()
    assert custom.read("Finished epoch 3, accuracy is 1.000000.") == Reading(step=3)
    one_epoch = ProgressReader()  # kubeflow dist-mnist, --epochs 1 (tf-keras, ParameterServerStrategy: verbose 2)
    assert one_epoch.read("120/120 - 6s - loss: 0.4637 - accuracy: 0.8825 - 6s/epoch - 52ms/step") == Reading(step=120)
    assert ProgressReader().read("Epoch 1: saving model to /runs/ckpt_1") is None, "a callback's word, not a loop's"


def test_a_line_rewritten_in_place_counts_by_its_last_update() -> None:
    line = "  1/469 [....] - ETA: 4s\r 50/469 [==>.] - ETA: 3s\r120/469 [===>] - ETA: 2s"
    reader = ProgressReader()
    assert reader.read("Epoch 1/5") is None
    assert reader.read(line) == Reading(step=120)


def test_a_tasks_own_pattern_comes_first() -> None:
    reader = ProgressReader(r"iter (?P<step>\d+)/")
    assert reader.read("iter 42/1000 done") == Reading(step=42)
    assert reader.read("step 7") == Reading(step=7), "tflab's own reading still applies to other lines"
    assert ProgressReader(r"(?P<rate>[\d.]+) it/s").read("12.5 it/s") == Reading(rate=12.5)


def test_a_bad_progress_pattern_in_tflab_yaml_names_its_key() -> None:
    with pytest.raises(UserError, match=r"tasks.train.progress needs a named group \(\?P<step>...\)"):
        taskfile.parse_tasks({"train": {"command": "python t.py", "progress": r"iter (\d+)"}}, "tflab.yaml")
    with pytest.raises(UserError, match=r"tasks.train.progress is not a regular expression"):
        taskfile.parse_tasks({"train": {"command": "python t.py", "progress": r"iter (?P<step>\d+"}}, "tflab.yaml")
    task = taskfile.parse_tasks({"train": {"command": "python t.py", "progress": r"it (?P<step>\d+)"}}, "x")["train"]
    assert taskfile.dump_tasks({"train": task}) == {"train": {"command": "python t.py", "progress": r"it (?P<step>\d+)"}}


def test_steps_per_second_from_steps_else_from_the_rate_a_program_reports() -> None:
    assert rate([(0.0, 0), (10.0, 500)]) == 50.0
    assert node_rate([], [(1.0, 40.0), (2.0, 42.0)]) == 42.0
    assert node_rate([(0.0, 0), (10.0, 100)], [(10.0, 99.0)]) == 10.0, "counted steps come first"


def test_a_bar_rewritten_in_place_is_read_as_it_moves() -> None:
    from tflab.plan.progress import LineSplitter

    updates, lines = LineSplitter(updates=True), LineSplitter()
    chunks = [b"Epoch 1/1\n\r\x1b[1m 1/3\x1b[0m \x1b[37m\xe2\x94\x81", b"\r\x1b[1m 2/3\x1b[0m \xe2\x94\x81\r 3/3 ",
              b"\xe2\x94\x81 done\n"]
    seen = [part for chunk in chunks for part in updates.feed(chunk)]
    reader = ProgressReader()
    assert [r.step for r in map(reader.read, seen) if r] == [1, 2, 3], "each rewrite is read when it comes"
    assert [line for chunk in chunks for line in lines.feed(chunk)][0] == "Epoch 1/1"


def test_keras_verbose_2_unknown_lengths_and_evaluate_after_fit() -> None:
    reader = ProgressReader()
    lines = [
        "Epoch 1/3",
        "120/Unknown - 5s 40ms/step - loss: 0.31",  # a dataset of unknown length: its first epoch
        "Epoch 2/3",
        "120/120 - 2s - loss: 0.1020 - accuracy: 0.9688 - 2s/epoch - 15ms/step",  # verbose=2
        "Epoch 3/3",
        "120/120 - 1s - 9ms/step - accuracy: 0.97 - loss: 0.09",  # Keras 3's verbose=2
        "12/12 [==============================] - 0s 3ms/step - loss: 0.12 - accuracy: 0.96",  # evaluate
    ]
    assert [reader.read(line) for line in lines] == [
        None, Reading(step=120), None, Reading(step=240), None, Reading(step=360), None]


def test_tqdm_and_lightning_bars() -> None:
    tqdm = ProgressReader()
    assert tqdm.read(" 45%|████▌     | 450/1000 [00:05<00:06, 90.00it/s]") == Reading(step=450)
    assert tqdm.read("100%|██████████| 1000/1000 [00:11<00:00, 89.12it/s]") == Reading(step=1000)
    lightning = ProgressReader()
    assert lightning.read("Epoch 0:  45%|████▌     | 45/100 [00:05<00:06,  9.00it/s, v_num=0]") == Reading(step=45)
    assert lightning.read("Epoch 1:  10%|█         | 10/100 [00:01<00:09,  9.00it/s, v_num=0]") == Reading(step=110)


@pytest.mark.parametrize(("line", "noise"), [
    ("I0000 00:00:1732478341.123456  123 cpu_feature_guard.cc:210] This TensorFlow binary is optimized", True),
    ("W1124 21:59:01.123456  140 grpc_server_lib.cc:301] Started server", True),
    ("2023-11-24 21:59:01.123456: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on.", True),
    ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", True),
    # a program's own absl records (absl.app.run, tf.compat.v1.app.run) are its output (issue 30.5)
    ("I1124 21:59:01.123456 140234 prog.py:14] test accuracy 0.98", False),
    ("I1124 21:59:01.123456 140234 basic_session_run_hooks.py:262] loss = 0.31, step = 5", False),
    ("E1124 21:59:01.123456  140 master.cc:301] the server went away", False),  # errors stay
])
def test_tensorflows_cpp_chatter_is_noise_and_a_programs_own_records_are_not(line: str, noise: bool) -> None:
    from tflab.plan.progress import is_noise

    assert is_noise(line) is noise


FIXTURES = Path(__file__).parent / "fixtures" / "output"


@pytest.mark.parametrize("name", ["keras3_verbose1.txt", "keras3_verbose2.txt"])
def test_real_keras_output_counts_its_batches_and_not_evaluate(name: str) -> None:
    """Captured from Keras 3 (TensorFlow 2.21) in a node: fit 3 epochs of 8 batches, evaluate, fit again."""
    from tflab.plan.progress import LineSplitter

    splitter, reader = LineSplitter(updates=True), ProgressReader()
    steps = [r.step for r in map(reader.read, splitter.feed((FIXTURES / name).read_bytes()) + splitter.rest()) if r]
    assert steps[-1] == 24 and steps == sorted(steps), steps  # evaluate's 8/8 and the second fit never step back
    assert {8, 16, 24} <= set(steps)


@pytest.mark.parametrize("name", ["keras3_fit1_verbose1.txt", "keras3_fit1_verbose2.txt"])
def test_a_fit_of_one_epoch_has_its_steps_read_and_its_evaluate_does_not(name: str) -> None:
    """Captured from Keras 3 (TensorFlow 2.21) in tflab-base:cpu: fit(epochs=1) of 8 batches, which prints no
    `Epoch 1/1`, then evaluate of 2 batches."""
    from tflab.plan.progress import LineSplitter

    splitter, reader = LineSplitter(updates=True), ProgressReader()
    steps = [r.step for r in map(reader.read, splitter.feed((FIXTURES / name).read_bytes()) + splitter.rest()) if r]
    assert steps[0] in (1, 8) and steps[-1] == 8 and steps == sorted(steps), steps


def test_real_tqdm_output_is_read_as_it_moves() -> None:
    """Captured from tqdm 4.70 into a pipe: one line rewritten with \\r, 50 iterations."""
    from tflab.plan.progress import LineSplitter

    splitter, reader = LineSplitter(updates=True), ProgressReader()
    parts = splitter.feed((FIXTURES / "tqdm.txt").read_bytes()) + splitter.rest()
    steps = [r.step for r in map(reader.read, parts) if r]
    assert steps[0] == 0 and steps[-1] == 50 and steps == sorted(steps) and len(steps) >= 40, steps


def test_a_worker_outliving_the_chiefs_coordination_service_is_recognised() -> None:
    """Captured from a 0.1-CPU MultiWorkerMirroredStrategy worker (TF 2.21) that ended after the chief."""
    from tflab.plan.progress import LEADER_GONE, is_noise, tensorflow_error

    lines = (FIXTURES / "mwms_worker_outlives_chief.txt").read_text().splitlines()
    assert len(lines) == 3
    assert LEADER_GONE.search(lines[0]) and LEADER_GONE.search(lines[1])
    assert all(tensorflow_error(line) and not is_noise(line) for line in lines)  # shown, but no program's result
    assert not tensorflow_error("worker2: final loss 0.031318 test accuracy 0.9694")
    assert not LEADER_GONE.search("worker2: final loss 0.031318 test accuracy 0.9694")


@pytest.mark.parametrize("name", ["keras3_fit1_verbose1.txt", "keras3_verbose1.txt", "tqdm.txt"])
def test_a_line_that_redraws_itself_is_shown_as_its_last_state(name: str) -> None:
    """What a pipe and output.log's reader see of a bar: one line per bar, as it ended, not every redraw."""
    from tflab.plan.progress import LineSplitter, displayed

    lines = LineSplitter().feed((FIXTURES / name).read_bytes())
    shown = [displayed(line) for line in lines]
    assert all("\r" not in line and "\b" not in line for line in shown)
    assert max(len(line) for line in shown) < 300, "no enormous line of every redraw"
    assert displayed("1/3 [..]\r2/3 [=.]\r3/3 [==] - 1s") == "3/3 [==] - 1s"
    assert displayed("loss: 0.69\b\b\b\b0.5 ") == "loss: 0.5 " and displayed("done\r") == "done"
