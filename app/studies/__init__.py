"""Studies: experiment design over runs, below the pages and the gate, above the library.

A study is several runs launched together and read together: an "A*-PO vs GRPO" pair under a stated protocol
(`protocols.py`: the paper's, TRL's defaults, or equal time), each run seed of it, or one spec over several seeds.
Every run of a study carries `{"study": {"id", "name", "kind", "protocol", "seed", "seeds"}}` in its spec, so a study
survives restarts as its runs do and needs no table of its own. `comparison.py` reads runs back: accuracy against
training time and tokens, medians over seeds, the verdict. The gate (`app.access.gate`) checks every run of a study
as it checks any launch, all or nothing.
"""
