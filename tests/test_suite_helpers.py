from fastpath import suite_helpers as H
from fastpath import trace


class _Engine:
    def __init__(self, device):
        self.device = device

    def info(self):
        return {"device": self.device}


def _refusals():
    with trace.recording() as rec:
        trace.refused("mla", "prefill")
        trace.refused("kda", "no_cuda")
        trace.refused("moe", "too_many_rows")
        trace.refused("moe", "too_many_rows", layer=3)
        trace.engaged("mla", "fused")
    return rec


def test_unexplained_refusals_drop_prefill_and_what_the_machine_explains():
    rec = _refusals()
    # on CPU no_cuda is expected; prefill is the hand-off; the rest put standard steps under "fast"
    assert H.unexplained_refusals(rec, _Engine("cpu")) == ["moe:too_many_rows"]
    # on a GPU no_cuda is a defect too
    assert H.unexplained_refusals(rec, _Engine("cuda:0")) == ["kda:no_cuda", "moe:too_many_rows"]
