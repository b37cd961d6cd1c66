"""The playground: a run's reference and trained policies answer one prompt side by side, scored by the run's
reward, and "Try the reward" scores a dataset's answers (docs/api.md, "The playground"). `client.py` is what the
studio's process imports; `process.py` is the model process it starts (`python -m app.runtime.playground`)."""
