"""The words a run spec and the records of its run share, defined once: what a run does (its action) and the
stage it is in. Light on purpose: the store and the studio's web process read it without importing torch."""

ACTIONS = ("train", "values", "evaluate")
"""What a run does: "train" (stage 1 then stage 2), "values" (A*-PO's stage 1 only: V* estimation), "evaluate"
(greedy accuracy on the held-out prompts)."""
STAGES = ("values", "train", "eval")
"""The stage a run is in: stage 1 (sampling the reference policy for V*), training, evaluation."""
