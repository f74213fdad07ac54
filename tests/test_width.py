"""The fixed-Ω width calculus against the paper's published lists (Sec. 4.1, App. C.2, C.4, C.5, D.1, D.3)."""
import math

import numpy as np
import pytest

from pkmixer.errors import ConfigError
from pkmixer.theory.width import (fixed_width_table, gamma_at_width, max_gamma_at_width, mixer_omega, mixer_width,
                                  optimal_channels, parse_omega, swmlp_width, symmetric_pairs, tokens_for_channels,
                                  width_bounds, width_summary, width_table)

# App. C.4 (i), γ = 1
C4_PAIRS = {
    2**18: [(16, 173), (32, 113), (48, 83), (83, 48), (113, 32), (173, 16)],
    2**21: [(16, 504), (32, 346), (64, 226), (226, 64), (346, 32), (504, 16)],
    2**27: [(128, 1386), (256, 904), (904, 256), (1386, 128)],
}


@pytest.mark.parametrize("omega", sorted(C4_PAIRS))
def test_app_c4_pairs_from_their_channels(omega):
    published = C4_PAIRS[omega]
    assert symmetric_pairs(omega, channels=[C for C, _ in published]) == published


@pytest.mark.parametrize("omega,count,c_min", [(2**21, 3, 16), (2**27, 2, 128)])
def test_app_c4_pairs_generated_geometrically_and_mirrored(omega, count, c_min):
    assert symmetric_pairs(omega, count=count, c_min=c_min) == C4_PAIRS[omega]


@pytest.mark.parametrize("omega,gamma,count", [(2**18, 1.0, 3), (2**20, 4.0, 4), (10**6, 2.5, 2)])
def test_generated_pairs_are_mirrored(omega, gamma, count):
    pairs = symmetric_pairs(omega, gamma, count=count, c_min=4)
    assert len(pairs) == 2 * count
    assert all((S, C) in pairs for C, S in pairs)
    assert all(C < optimal_channels(omega, gamma) for C, _ in pairs[:count])


def test_app_c2_tokens_for_channels():
    channels = [4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 64]
    tokens = [360, 252, 203, 173, 152, 136, 124, 113, 104, 96, 89, 83, 64]
    assert [tokens_for_channels(2**19, C, gamma=2) for C in channels] == tokens


def test_app_c4_swmlp_widths():
    assert [swmlp_width(2**18, 1 - frozen) for frozen in (0.1, 0.3, 0.5, 0.7, 0.9)] == [540, 612, 724, 935, 1619]


def test_app_c5_imagenet_omega():
    omega = parse_omega("290217984")
    assert omega == mixer_omega(768, 196, gamma=4) == 4 * (768**2 * 196 + 768 * 196**2) / 2
    assert tokens_for_channels(omega, 768, gamma=4) == 196


@pytest.mark.parametrize("omega,gamma", [(2**18, 1.0), (2**19, 2.0), (290217984, 4.0), (12345, 1.5)])
def test_optimum_is_the_brute_force_maximiser(omega, gamma):
    summary = width_summary(omega, gamma)
    C = np.arange(1, int(4 * summary.c_star))
    m = np.array([mixer_width(omega, float(c), gamma) for c in C])
    best = int(C[m.argmax()])
    assert abs(best - summary.c_star) < 1
    assert m.max() <= summary.m_max * (1 + 1e-12)
    assert summary.m_max == pytest.approx((omega / gamma) ** (2 / 3), rel=1e-12)
    # at C* the exact S equals C*, and the density Ω/(γm²) is smallest
    assert mixer_width(omega, summary.c_star, gamma) == pytest.approx(summary.c_star**2, rel=1e-12)
    assert summary.p_min == pytest.approx(omega / (gamma * m.max() ** 2), rel=1e-3)
    assert summary.p_min <= (omega / (gamma * m**2)).min() * (1 + 1e-12)
    assert summary.m_upper == pytest.approx(summary.m_max)


def test_summary_integer_point_and_swmlp_dense_width():
    summary = width_summary("2**18")
    assert (summary.C, summary.S, summary.m) == (64, 64, 4096)
    assert summary.p_min == pytest.approx(1 / 64)
    assert summary.swmlp_dense_width == pytest.approx(512)
    assert set(summary.as_dict()) >= {"c_star", "m_max", "p_min", "m_lower", "m_upper"}


def test_bounds_hold_for_every_integer_pair():
    for omega, pairs in C4_PAIRS.items():
        lower, upper = width_bounds(omega)
        assert all(lower <= C * S <= upper * (1 + 1e-12) for C, S in pairs)
    rng = np.random.default_rng(0)
    for C, S in rng.integers(1, 500, size=(200, 2)).tolist():
        lower, upper = width_bounds(mixer_omega(C, S, gamma=3.0), gamma=3.0)  # the pair's own Ω
        assert lower * (1 - 1e-12) <= C * S <= upper * (1 + 1e-12)
    # equality of the lower bound at C = 1 (S.45)
    lower, _ = width_bounds(mixer_omega(1, 37, gamma=2.0), gamma=2.0)
    assert lower == pytest.approx(37)


def test_gamma_at_fixed_width_peaks_at_sqrt_m():
    omega, m = 2**20, 4096
    C = np.arange(1, m + 1)
    gammas = np.array([gamma_at_width(omega, m, float(c)) for c in C])
    c_star, gamma_max = max_gamma_at_width(omega, m)
    assert C[gammas.argmax()] == c_star == 64
    assert gammas.max() == pytest.approx(gamma_max) == pytest.approx(omega / m**1.5)
    # γ from S.46 puts the pair back on Ω: Ω = γ (C S² + C² S)/2 with S = m/C
    assert mixer_omega(16, 256, gamma_at_width(omega, m, 16)) == pytest.approx(omega)
    rows = fixed_width_table(omega, m)
    assert [r["C"] for r in rows] == [2**k for k in range(13)]
    assert max(rows, key=lambda r: r["gamma"])["C"] == 64


def test_width_table_rows():
    rows = width_table("2**18", channels=[16, 173], densities=[0.9, 0.1])
    assert [(r["kind"], r["C"], r["S"], r["m"]) for r in rows] == [
        ("mixer", 16, 173, 2768), ("mixer", 173, 16, 2768), ("swmlp", None, None, 540), ("swmlp", None, None, 1619)]
    mixer = rows[0]
    assert mixer["p"] == pytest.approx(mixer["omega"] / (mixer["gamma"] * mixer["m"] ** 2))  # Eq. 13
    assert mixer["p"] == pytest.approx((1 / 16 + 1 / 173) / 2)
    assert rows[3]["omega"] == pytest.approx(0.1 * 1619**2)
    assert len(width_table(2**21)) == 6  # default: count = 3, mirrored


def test_parse_omega():
    assert parse_omega("2**18") == 262144 and isinstance(parse_omega("2**18"), int)
    assert parse_omega("3*2**20") == 3 * 2**20
    assert parse_omega(" (768**2*196 + 768*196**2) * 4 / 2 ") == 290217984
    assert parse_omega("1e8") == 10**8
    assert parse_omega(1000) == 1000
    assert parse_omega("2**18/3") == pytest.approx(2**18 / 3)


@pytest.mark.parametrize("expr", ["__import__('os')", "x", "2**18; 1", "abs(-4)", "2**1000", "9**9**9", "1/0",
                                  "-5", "0", "2**18 - 2**18", "[1]", "1j", "", "True",
                                  "1\x00", "-" * 5000 + "1", "(-8)**0.5", "0**-1", "1e400"])
def test_parse_omega_rejects(expr):
    with pytest.raises(ConfigError, match="Ω"):
        parse_omega(expr)


def test_parse_omega_names_the_bad_expression():
    with pytest.raises(ConfigError, match=r"bad Ω expression '2\*\*x'.*'x' is not allowed"):
        parse_omega("2**x")


@pytest.mark.parametrize("call", [
    lambda: tokens_for_channels(-1, 16),
    lambda: tokens_for_channels(2**18, 16, gamma=0),
    lambda: tokens_for_channels(2**18, 16, gamma=-2.0),
    lambda: tokens_for_channels(2**18, 0),
    lambda: tokens_for_channels(100, 1000),  # S would round to 0
    lambda: swmlp_width(2**18, 0.0),
    lambda: swmlp_width(2**18, 1.5),
    lambda: width_table(2**18, densities=[-0.1]),
    lambda: symmetric_pairs(2**18),  # neither channels nor count
    lambda: symmetric_pairs(2**18, channels=[16], count=3),
    lambda: symmetric_pairs(2**12, count=3),  # c_min = 16 ≥ C* = 16
    lambda: symmetric_pairs(2**18, count=40, c_min=60),  # not enough distinct C in [60, 64)
    lambda: fixed_width_table(2**18, 4096, channels=[3]),
    lambda: gamma_at_width(2**18, 0, 4),
])
def test_bad_input_raises_config_error(call):
    with pytest.raises(ConfigError):
        call()


def test_exact_tokens_round_trip():
    # S(C) solves Eq. 14 exactly before rounding
    omega, gamma, C = 2**19, 2.0, 20
    S = mixer_width(omega, C, gamma) / C
    assert gamma * (C * S * S + C * C * S) / 2 == pytest.approx(omega, rel=1e-12)
    assert tokens_for_channels(omega, C, gamma) == math.floor(S + 0.5)
