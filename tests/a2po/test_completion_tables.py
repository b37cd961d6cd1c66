"""Completion tables as TRL 1.16 writes them (`log_completions`): both trainers on the tiny model write
`completions/completions_{step:05d}.parquet` with TRL's columns, which pandas and datasets load; the printed table
honours `num_completions_to_print` and `log_unique_prompts`; the studio's store keeps each sample's per-reward values
and `log_extra` columns (`samples.extra`, revision 0006), and the Export page zips the same layout from the store."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sqlite3
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from datasets import load_dataset

from a2po import A2POConfig, GRPOConfig, GRPOTrainer
from a2po.completions import print_completions
from a2po.config import ConfigError
from a2po.trainer import A2POTrainer
from app.access.gate import Services
from app.runtime import chunks, journal
from app.runtime.recorder import StoreRecorder
from app.web.pages.export import zip_completions
from storage import Store, lifecycle, migrations
from tests.a2po.test_trainer import coin, prompts

pytestmark = pytest.mark.filterwarnings("ignore:Rewards outside")
TRL_SPEC = importlib.util.find_spec("trl")
needs_trl = pytest.mark.skipif(TRL_SPEC is None, reason="TRL (the `bench` extra) is not installed")


def trl_table_columns() -> list[str]:
    """The columns of the table TRL 1.16's GRPOTrainer.log writes to parquet, read from its source: literal names,
    and `*rewards` / `*extra` where it spreads the reward functions' and the `log_extra` columns."""
    source = (Path(TRL_SPEC.submodule_search_locations[0]) / "trainer" / "grpo_trainer.py").read_text()
    block = re.search(r"\n(\s+)table = \{\n(.*?)\n\1\}", source, re.S).group(2)
    columns = []
    for line in block.splitlines():
        literal = re.match(r'\s*"(\w+)":', line)
        spread = re.match(r'\s*\*\*self\._logs\["(\w+)"\]', line)
        columns.append(literal.group(1) if literal else f"*{spread.group(1)}")
    return columns


def source_tag(prompts, completions, log_extra, **kwargs):
    """A TRL 1.16 reward: 0.5 for every completion, and a `log_extra` column (the prompt's parity)."""
    log_extra("parity_seen", list(kwargs["parity"]))
    return [0.5] * len(completions)


def expected_columns(extra_after_advantage: tuple[str, ...] = ()) -> list[str]:
    spread = {"*rewards": ["coin", "source_tag"], "*extra": ["parity_seen"]}
    return [name for column in trl_table_columns() for name in spread.get(column, [column])] + list(
        extra_after_advantage)


def grpo_args(tmp_path, **overrides) -> GRPOConfig:
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2, max_steps=2,
                  max_completion_length=6, use_cpu=True, logging_steps=1, report_to="none", save_strategy="no",
                  learning_rate=1e-2, seed=0, disable_tqdm=True, gradient_checkpointing=False, log_completions=True)
    values.update(overrides)
    return GRPOConfig(**values)


def a2po_args(tmp_path, **overrides) -> A2POConfig:
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2, num_value_samples=4,
                  max_completion_length=6, use_cpu=True, logging_steps=1, report_to="none", save_strategy="no",
                  learning_rate=1e-2, seed=0, disable_tqdm=True, log_completions=True)
    values.update(overrides)
    return A2POConfig(**values)


def tables(output_dir: str | Path) -> dict[int, pd.DataFrame]:
    files = sorted((Path(output_dir) / "completions").glob("completions_*.parquet"))
    return {int(f.stem.split("_")[1]): pd.read_parquet(f) for f in files}


@needs_trl
def test_the_configs_have_trl_s_fields_with_trl_s_defaults():
    from trl import GRPOConfig as TRLGRPOConfig

    theirs = {f.name: f for f in dataclasses.fields(TRLGRPOConfig)}
    for config_class in (GRPOConfig, A2POConfig):
        ours = {f.name: f for f in dataclasses.fields(config_class)}
        for name in ("log_completions", "num_completions_to_print", "log_unique_prompts"):
            assert ours[name].default == theirs[name].default, (config_class, name)
        for name in ("num_completions_to_print", "log_unique_prompts"):
            assert ours[name].metadata["help"] == theirs[name].metadata["help"]


def test_bad_settings_are_refused_at_config_time(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="num_completions_to_print must be >= 0"):
        grpo_args(tmp_path, num_completions_to_print=-1)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow"
                        else real_find_spec(name, *a))
    with pytest.raises(ConfigError, match="log_completions writes parquet files with pyarrow, which is not installed"):
        a2po_args(tmp_path)
    assert not a2po_args(tmp_path, log_completions=False).log_completions  # off: pyarrow is not needed


@needs_trl
def test_grpo_writes_trl_s_files_at_each_logging_step(tmp_path, tiny_model_dir, capsys):
    args = grpo_args(tmp_path, gradient_accumulation_steps=2, max_steps=4, logging_steps=2)
    trainer = GRPOTrainer(tiny_model_dir, [coin, source_tag], args=args, train_dataset=prompts(8))
    trainer.train()
    written = tables(args.output_dir)
    assert sorted(written) == [2, 4]  # the logging steps, as TRL names them
    for step, table in written.items():
        assert list(table.columns) == expected_columns()
        assert len(table) == 8  # the latest generation: 4 completions x 2 micro-batches
        assert (table["step"] == step).all()
        assert table["source_tag"].eq(0.5).all() and table["coin"].isin([0.0, 1.0]).all()
        # The prompt and completion as the reward functions got them: conversations, as in TRL.
        assert [m["role"] for m in table["prompt"][0]] == ["user"] and table["completion"][0][0]["role"] == \
            "assistant"
        assert set(table["parity_seen"]) <= {"even", "odd"}
        # G = 2 completions of each prompt: GRPO's advantages of a group are opposite (or both 0).
        pairs = table["advantage"].to_numpy().reshape(-1, 2)
        assert abs(pairs.sum(axis=1)).max() < 1e-6
    # TRL's other reader: the `datasets` parquet loader.
    loaded = load_dataset("parquet", data_files=str(Path(args.output_dir) / "completions" / "*.parquet"),
                          split="train")
    assert loaded.column_names == expected_columns() and len(loaded) == 16
    printed = capsys.readouterr().out
    assert "Step 2" in printed and "Step 4" in printed and printed.count("USER") == 16


@needs_trl
def test_a2po_adds_v_star_and_the_implicit_reward(tmp_path, tiny_model_dir):
    args = a2po_args(tmp_path, filter_all_incorrect=False, reward_weights=[1.0, 2.0])
    trainer = A2POTrainer(tiny_model_dir, [coin, source_tag], args=args, train_dataset=prompts(8))
    trainer.train()
    written = tables(args.output_dir)
    assert sorted(written) == [1, 2]
    for table in written.values():
        assert list(table.columns) == expected_columns(("v_star", "implicit_reward"))
        assert len(table) == 4
        # A*-PO's advantage is r - V*, the target the implicit reward is regressed onto (r: the weighted sum).
        reward = table["coin"] + 2.0 * table["source_tag"]
        assert (table["advantage"] - (reward - table["v_star"])).abs().max() < 1e-5


def test_unique_prompts_and_the_number_printed(tmp_path, tiny_model_dir, capsys):
    args = grpo_args(tmp_path, max_steps=1, log_unique_prompts=True)
    GRPOTrainer(tiny_model_dir, coin, args=args, train_dataset=prompts(8)).train()
    printed = capsys.readouterr().out
    assert printed.count("USER") == 2  # 4 completions of 2 prompts: one row per prompt
    assert len(tables(args.output_dir)[1]) == 4  # the file keeps every completion, as TRL's

    args = grpo_args(tmp_path / "two", max_steps=1, num_completions_to_print=1)
    GRPOTrainer(tiny_model_dir, coin, args=args, train_dataset=prompts(8)).train()
    assert capsys.readouterr().out.count("USER") == 1


def test_without_rich_the_table_is_printed_as_text(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich.console", None)  # as if rich were not installed
    rows = [{"step": 3, "prompt": "1 + 1 =", "completion": " 2", "coin": 1.0, "advantage": 0.5, "source": "A"}]
    print_completions(rows, 3, ["coin"])
    assert capsys.readouterr().out.splitlines() == [
        "--- Step 3 ---", "Prompt: 1 + 1 =", "Completion:  2", "coin: 1.00", "Advantage: 0.50", "source: A", ""]


def test_the_store_keeps_each_reward_and_the_log_extra_columns(tmp_path):
    store = Store(str(tmp_path / "studio.db"))
    run_id = store.create_run("grpo", "train", {})
    sample = {"step": 1, "prompt_id": "p0", "completion": "4", "reward": 1.0, "advantage": 0.5,
              "rewards": {"coin": 1.0, "format": None}, "extra": {"source": "A", "weight": float("nan")}}
    assert store.add_samples(run_id, [sample]) == 1
    extra = store.get_samples(run_id)[0]["extra"]
    assert list(extra.items()) == [("coin", 1.0), ("format", None), ("source", "A"), ("weight", None)]
    store.add_samples(run_id, [{"step": 2, "prompt_id": "p0", "completion": "5"}])  # none: NULL, not {}
    assert store.get_samples(run_id, step=2)[0]["extra"] is None
    store.close()


def test_a_chunk_s_journal_carries_them_unchanged(tmp_path):
    store = Store(str(tmp_path / "studio.db"))
    direct, chunked = store.create_run("a", "train", {}), store.create_run("b", "train", {})
    assert store.apply(chunked, lifecycle.CLAIM, pid=os.getpid())
    samples = [{"step": 1, "prompt_id": "p0", "completion": "4", "rewards": {"coin": 1.0},
                "extra": {"tag": [1, 2], "weight": float("nan")}}]
    store.add_samples(direct, samples)
    data = tmp_path / "data"
    journal.write_input(store, data, store.get_run(chunked))
    ledger = journal.ChunkLedger(data, chunked)
    ledger.add_samples(chunked, samples)
    ledger.close()
    chunks.ingest(store, data, chunked)
    stored = [store.get_samples(run_id)[0]["extra"] for run_id in (direct, chunked)]
    assert stored == [{"coin": 1.0, "tag": [1, 2], "weight": None}] * 2
    store.close()


@needs_trl
def test_the_export_zips_the_run_s_tables_in_trl_s_layout(tmp_path, tiny_model_dir):
    """A GRPO run recorded into the store by the studio's recorder: the export has the trainer's files, columns and
    values (the prompt as the studio shows it, the question)."""
    store = Store(str(tmp_path / "studio.db"))
    run_id = store.create_run("grpo", "train", {})
    args = grpo_args(tmp_path, max_steps=2)
    trainer = GRPOTrainer(tiny_model_dir, [coin, source_tag], args=args, train_dataset=prompts(8),
                          callbacks=[StoreRecorder(store, run_id)])
    trainer.train()
    services = Services(store=store, scheduler=None, data_dir=tmp_path / "studio")
    archive = zip_completions(services, run_id)
    assert archive.name == f"run-{run_id}-completions.zip"
    with zipfile.ZipFile(archive) as zipped:
        assert sorted(zipped.namelist()) == ["completions/completions_00001.parquet",
                                             "completions/completions_00002.parquet"]
        zipped.extractall(tmp_path / "exported")
    exported, trained = tables(tmp_path / "exported"), tables(args.output_dir)
    for step, table in exported.items():
        assert list(table.columns) == expected_columns()
        assert table["prompt"].tolist() == [p[0]["content"] for p in trained[step]["prompt"]]
        for column in ("step", "coin", "source_tag", "parity_seen"):
            assert table[column].tolist() == trained[step][column].tolist()
        assert table["advantage"].tolist() == pytest.approx(trained[step]["advantage"].tolist())
    with pytest.raises(ValueError, match="no training samples"):
        zip_completions(services, store.create_run("empty", "train", {}))
    store.close()


def test_an_old_database_gains_the_column_with_its_samples_intact(tmp_path):
    path = tmp_path / "studio.db"
    store = Store(str(path))
    run_id = store.create_run("a*-po", "train", {})
    store.add_samples(run_id, [{"step": 1, "prompt_id": "p0", "completion": "4", "reward": 1.0, "v_star": 0.5,
                                "advantage": 0.5, "implicit_reward": 0.1}])
    with store._write() as s:
        migrations._alembic(s.connection(), "downgrade", "0005")
    store.close()
    con = sqlite3.connect(path)
    assert "extra" not in [c[1] for c in con.execute("PRAGMA table_info(samples)")]
    before = con.execute("SELECT * FROM samples").fetchall()
    con.close()

    upgraded = Store(str(path))  # opening migrates it to HEAD
    assert upgraded.get_samples(run_id)[0]["extra"] is None
    con = sqlite3.connect(path)
    assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(migrations.HEAD,)]
    after = con.execute("SELECT * FROM samples").fetchall()
    con.close()
    assert [row[:-1] if len(row) > len(before[0]) else row for row in after] == before
    upgraded.add_samples(run_id, [{"step": 2, "prompt_id": "p0", "rewards": {"coin": 1.0}}])
    assert upgraded.get_samples(run_id, step=2)[0]["extra"] == {"coin": 1.0}
    # Going back would lose that value: the downgrade refuses and changes nothing.
    with pytest.raises(RuntimeError, match="Revision 0006 cannot be undone"), upgraded._write() as s:
        migrations._alembic(s.connection(), "downgrade", "0005")
    assert upgraded.get_samples(run_id, step=2)[0]["extra"] == {"coin": 1.0}
    upgraded.close()
