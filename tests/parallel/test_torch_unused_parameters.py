"""torch DistributedOptimizer names the parameters that get no gradient (issue 28, item 5), once each.

- On some ranks but not others (a branch the odd ranks skip): the first set rank logs one warning naming the
  parameters and the ranks on either side; the zero-filled allreduce still runs, so no rank waits.
- On every rank for 3 steps in a row (a head nobody uses): one warning naming them, with the remedies.

The ranks learn the first case from a small allreduce: a blocking fast round where the ranks share a host, read
at once; otherwise one that the next ``synchronize`` reads, so a step's report comes one step later. In a
one-rank job the local flags are read at once.
"""
import logging

import pytest
import torch
from torch import nn

import horovod.torch as hvd
from horovod.core import ops
from horovod.torch.unused_parameters import STEPS_IN_A_ROW
from tests.support.fast_rounds import fast_round_count

torch.set_num_threads(1)


class Branchy(nn.Module):
    """``shared`` is used everywhere, ``branch`` only where ``use_branch``, ``head`` never."""

    def __init__(self, use_branch: bool):
        super().__init__()
        torch.manual_seed(0)
        self.shared = nn.Linear(4, 2)
        self.branch = nn.Linear(4, 2)
        self.head = nn.Linear(4, 2)
        self.use_branch = use_branch

    def forward(self, x):
        y = self.shared(x)
        return y + self.branch(x) if self.use_branch else y


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_logged():
    """The warnings of the ``horovod.torch`` logger (it does not propagate to the root logger)."""
    handler = Records()
    logger = logging.getLogger("horovod.torch")
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


def train(model, optimizer, steps):
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()


def make(use_branch, named=True, **kwargs):
    model = Branchy(use_branch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    named_parameters = model.named_parameters() if named else None
    return model, hvd.DistributedOptimizer(opt, named_parameters=named_parameters, **kwargs)


def odd_and_even():
    ranks = range(hvd.size())
    return [r for r in ranks if r % 2 == 1], [r for r in ranks if r % 2 == 0]


def about(messages, text):
    return [m for m in messages if text in m]


def test_parameter_unused_on_some_ranks_is_named_once_with_the_ranks(warnings_logged):
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    model, opt = make(use_branch=hvd.rank() % 2 == 0)
    train(model, opt, 4)
    odd, even = odd_and_even()
    expected = (f"horovod.torch.DistributedOptimizer: parameters 'branch.bias', 'branch.weight' got no gradient on "
                f"rank(s) {odd} but did on rank(s) {even} at step 1. Horovod averaged zeros from the ranks without "
                "a gradient into the others'")
    if hvd.rank() == 0:
        assert len(about(warnings_logged, expected)) == 1, warnings_logged
        assert "Make the loss depend on the same parameters on every rank" in about(warnings_logged, expected)[0]
    else:
        assert warnings_logged == []
    # The zero-filled allreduce still ran on every rank: the same averaged gradient everywhere.
    grad = model.branch.weight.grad
    assert grad is not None
    gathered = hvd.allgather(grad.unsqueeze(0))
    assert all(torch.equal(g, gathered[0]) for g in gathered)
    assert torch.allclose(grad, torch.full_like(grad, 3.0 * len(even) / hvd.size()))


def test_parameter_unused_everywhere_is_named_after_three_steps(warnings_logged):
    model, opt = make(use_branch=True)
    where = "on this rank" if hvd.size() == 1 else f"on any of the {hvd.size()} ranks"
    expected = (f"horovod.torch.DistributedOptimizer: parameters 'head.bias', 'head.weight' got no gradient {where} "
                f"for {STEPS_IN_A_ROW} steps in a row (steps 1-{STEPS_IN_A_ROW}).")
    # One rank reads its own flags at once, and so do ranks with fast rounds (one host: the sum is a blocking
    # fast round); otherwise step k's sum is read by step k + 1.
    due = STEPS_IN_A_ROW if hvd.size() == 1 or ops.has_fast_rounds() else STEPS_IN_A_ROW + 1
    train(model, opt, due - 1)
    assert about(warnings_logged, "'head.bias'") == []
    train(model, opt, 3 * STEPS_IN_A_ROW)
    if hvd.rank() == 0:
        named = about(warnings_logged, expected)
        assert len(named) == 1 and len(warnings_logged) == 1, warnings_logged
        assert "set requires_grad=False on them before creating the DistributedOptimizer" in named[0]
        assert "find_unused_parameters" in named[0]
    else:
        assert warnings_logged == []


def test_a_step_with_a_gradient_restarts_the_count(warnings_logged):
    model, opt = make(use_branch=True)
    for step in range(3 * STEPS_IN_A_ROW):
        opt.zero_grad()
        out = model(torch.ones(3, 4))
        if step % STEPS_IN_A_ROW == STEPS_IN_A_ROW - 1:      # the head is used every third step
            out = out + model.head(torch.ones(3, 4))
        out.sum().backward()
        opt.step()
    train(model, opt, 1)
    assert about(warnings_logged, "'head.") == []


def test_parameters_without_names_get_positional_names(warnings_logged):
    model, opt = make(use_branch=True, named=False)
    train(model, opt, STEPS_IN_A_ROW + 1)
    if hvd.rank() == 0:
        # model.parameters(): shared.weight, shared.bias, branch.weight, branch.bias, head.weight, head.bias
        assert len(about(warnings_logged, "parameters 'allreduce.noname.0.4', 'allreduce.noname.0.5' got no "
                                          "gradient")) == 1, warnings_logged


def test_used_and_frozen_parameters_are_not_reported(warnings_logged):
    model = Branchy(use_branch=True)
    model.head.requires_grad_(False)              # frozen before wrapping: not part of the exchange at all
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    train(model, opt, 2 * STEPS_IN_A_ROW + 1)
    assert warnings_logged == []
    assert model.head.weight.grad is None


def test_groups_and_backward_passes_still_count_used_parameters(warnings_logged):
    model, opt = make(use_branch=True, groups=2, backward_passes_per_step=2)
    for _ in range(2 * STEPS_IN_A_ROW + 1):
        opt.zero_grad()
        for _ in range(2):
            model(torch.ones(3, 4)).sum().backward()
        opt.step()
    if hvd.rank() == 0:
        assert len(about(warnings_logged, "'head.bias', 'head.weight' got no gradient")) == 1, warnings_logged
        assert about(warnings_logged, "'branch.") == [] and about(warnings_logged, "'shared.") == []
    else:
        assert warnings_logged == []


def test_two_optimizers_with_the_same_parameter_names_step_one_after_the_other(warnings_logged):
    """Teacher and student of one architecture: same parameter names, each its own optimizer and masks."""
    (teacher, t_opt), (student, s_opt) = make(use_branch=True), make(use_branch=True)
    assert t_opt._unused.tensor_name != s_opt._unused.tensor_name
    for _ in range(STEPS_IN_A_ROW + 1):
        train(teacher, t_opt, 1)
        train(student, s_opt, 1)
    if hvd.rank() == 0:
        assert len(about(warnings_logged, "parameters 'head.bias', 'head.weight' got no gradient")) == 2, \
            warnings_logged


@pytest.mark.parametrize("kwargs", [{}, {"op": hvd.Sum}, {"gradient_predivide_factor": 4.0}],
                         ids=["average", "sum", "predivide"])
def test_the_count_that_goes_with_the_small_gradients_finds_a_parameter_unused_on_some_ranks(warnings_logged, kwargs):
    """Where the small gradients take one fast round at ``step()``, each rank's count of parameters without a
    gradient goes with them: a step where every rank has every gradient is that one round, and a step where some
    ranks lack one still exchanges the masks (a second round) and names the ranks in that step, whatever the op
    and scale factors."""
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    model, opt = make(use_branch=True, **kwargs)
    before, counting = fast_round_count()

    def step(with_branch):
        opt.zero_grad()
        x = torch.ones(3, 4)
        out = model.shared(x) + model.head(x)
        (out + model.branch(x) if with_branch else out).sum().backward()
        opt.step()

    for _ in range(2):
        step(True)
    if counting:
        assert fast_round_count()[0] == before + 2, "a step with every gradient everywhere is one round"
    step(hvd.rank() % 2 == 0)
    if counting:
        assert fast_round_count()[0] == before + 4, "a step with a gradient missing somewhere adds the masks round"
    odd, even = odd_and_even()
    expected = (f"parameters 'branch.bias', 'branch.weight' got no gradient on rank(s) {odd} but did on rank(s) "
                f"{even} at step 3.")
    if hvd.rank() == 0:
        assert len(about(warnings_logged, expected)) == 1, warnings_logged
    else:
        assert warnings_logged == []
