"""The framework-free gradient rules (``horovod.common.gradient_groups``) that TF, Keras and torch share."""
import pytest

from horovod.common.gradient_groups import check_predivide, fixed_groups, scale_factors, split_into_groups
from horovod.common.types import Adasum, Average, Sum

pytestmark = pytest.mark.timeout(60)


class Param:
    """Stands for a framework's parameter type."""


def test_scale_factors_split_the_average_around_the_sum():
    assert scale_factors(Average, 4.0) == (0.25, 4.0)
    assert scale_factors(Sum, 1.0) == (1.0, 1.0)
    assert scale_factors(Adasum, 1.0) == (1.0, 1.0)     # no predivide, no average: Adasum weighs itself
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        scale_factors(Adasum, 2.0)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        scale_factors(Sum, 2.0)


def test_check_predivide():
    check_predivide(Average, 2.0)
    check_predivide(Sum, 1.0)
    with pytest.raises(ValueError, match="op != Average"):
        check_predivide(Adasum, 2.0)


def test_split_into_groups_by_count_and_by_lists():
    variables = [Param() for _ in range(5)]
    assert split_into_groups([0, 1, 2, 3, 4], variables, 2) == [[0, 1, 2], [3, 4]]
    assert split_into_groups([0, 1], variables, 9) == [[0], [1]]
    assert split_into_groups([0, 1, 2, 3], variables, [[variables[3], variables[0]]]) == [[0, 3], [1], [2]]
    assert split_into_groups([0, 1, 2], variables, None) == [[0, 1, 2]]


def test_fixed_groups_by_count():
    variables = [Param() for _ in range(5)]
    assert fixed_groups(None, variables, Param) is None and fixed_groups(0, variables, Param) is None
    assert fixed_groups(2, variables, Param) == [variables[:3], variables[3:]]
    assert fixed_groups(9, variables[:2], Param) == [[variables[0]], [variables[1]]]
    assert fixed_groups(3, [], Param) == []
    with pytest.raises(ValueError, match="non-negative integer"):
        fixed_groups(-1, variables, Param)


def test_fixed_groups_by_lists_keep_the_users_order_and_are_checked():
    a, b, c = Param(), Param(), Param()
    assert fixed_groups([[c, a], (b,)], [a, b, c], Param) == [[c, a], [b]]
    with pytest.raises(ValueError, match=r"groups must be a list of lists of .*Param \(parameters\)"):
        fixed_groups([[a, "b"]], [a, b], Param)
    with pytest.raises(ValueError, match="a parameter appears in more than one group"):
        fixed_groups([[a, b], [b]], [a, b], Param)
