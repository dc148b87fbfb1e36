"""What runs cost: the price a cluster's nodes are counted at (its profile's VM size, region and Spot or
not), and `hpcjob prices`' rows. The prices are hpcjob.store.prices'; the arithmetic hpcjob.job.prices'.
A local run has no cost, and a cluster whose profile names no size or region none that hpcjob knows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hpcjob.job.spec import SpecError
from hpcjob.runner.access import Progress

if TYPE_CHECKING:
    from hpcjob.job.prices import Price
    from hpcjob.store.config import ClusterProfile
    from hpcjob.store.prices import Found


def node_price(profile: ClusterProfile, progress: Progress, *, for_data_nodes: bool = False) -> Price | None:
    """The price of the profile's compute nodes (Linux; Spot where the profile says so), or with
    `for_data_nodes` of its CPU data nodes (data_vm_size, Linux), or None, with a warning to `progress` when
    the profile names a size and region and still no price is found (hpcjob.store.prices's answer)."""
    price, why = _price_or_why(profile, progress, for_data_nodes=for_data_nodes)
    if why is not None:
        progress(f"hpcjob: warning: the run's cost is not counted: {why}")
    return price


def _price_or_why(
    profile: ClusterProfile, progress: Progress, *, for_data_nodes: bool = False
) -> tuple[Price | None, str | None]:
    """The nodes' price, or why there is none (None as well when the profile names no size or region:
    a cluster hpcjob knows no price of, and says nothing of). Where the prices came from, if not the API
    of today, is warned of to `progress`."""
    from hpcjob.job.prices import LINUX, SPOT
    from hpcjob.store.prices import hourly_price

    size = profile.data_vm_size if for_data_nodes else profile.vm_size
    if for_data_nodes and profile.vm_size and profile.region and not size:
        return None, (
            "its data nodes' size is not known (`hpcjob cluster add --data-vm-size`), and they are not GPU "
            "nodes"
        )
    if not size or not profile.region:
        return None, None
    spot = bool(profile.spot) and not for_data_nodes
    answer = hourly_price(size, profile.region, SPOT if spot else LINUX)
    if answer.warning:
        progress(f"hpcjob: warning: {answer.warning}")
    price = answer.price()
    return price, None if price is not None else answer.unknown


def unbounded_cost(
    profile: ClusterProfile, progress: Progress, *, for_data_nodes: bool = False
) -> str | None:
    """Why `--max-cost` cannot bound a run on the profile's cluster (its nodes, or its data nodes, have
    no price), in a few words; None when it can. Said before the first attempt."""
    prices = [_price_or_why(profile, progress)]
    if for_data_nodes:
        prices.append(_price_or_why(profile, progress, for_data_nodes=True))
    why = [reason for price, reason in prices if price is None]
    if not why:
        return None
    return "; ".join(reason or "its cluster profile names no --vm-size and --region" for reason in why)


def run_price(
    cluster: str | None, progress: Progress, *, for_data_nodes: bool = False
) -> tuple[Price | None, Price | None]:
    """The prices a run on `cluster` (None: a local run) is counted at: its GPU nodes', and with
    `for_data_nodes` its data nodes' (None where the run has none)."""
    from hpcjob.store.config import get_profile

    if cluster is None:
        return None, None
    try:
        profile = get_profile(cluster)
    except SpecError:
        return None, None  # the profile is gone or broken: the run's end matters more
    gpus = node_price(profile, progress)
    return gpus, node_price(profile, progress, for_data_nodes=True) if for_data_nodes else None


def price_rows(
    sizes: Sequence[str], region: str | None, *, refresh: bool, cluster: str | None = None
) -> tuple[list[Found], list[str]]:
    """`hpcjob prices`: the prices of `sizes` in `region`; where not given, the (default) cluster's
    profile's size and region, and its head node's size when hpcjob onboarded it. Each size's prices,
    and the warnings (one line each)."""
    from hpcjob.job.prices import check_region, check_size
    from hpcjob.store.prices import size_prices

    for size in sizes:
        check_size(size)
    if region is not None:
        check_region(region)
    wanted = list(dict.fromkeys(sizes))
    if not wanted or region is None:
        profile = _profile_or_none(cluster)
        if region is None:
            region = profile.region if profile else None
        if not wanted and profile is not None and profile.vm_size:
            wanted.append(profile.vm_size)
            if profile.resource_group:  # onboarded: its head node is the package's size
                from hpcjob.job.sizes import size_table

                wanted.append(size_table().head_node_size)
    if not wanted:
        raise SpecError(
            "give --size SIZE: the cluster profile names no vm_size (`hpcjob cluster add --vm-size`)"
        )
    if region is None:
        raise SpecError(
            "give --region REGION: the cluster profile names no region (`hpcjob cluster add --region`)"
        )
    found, warnings = [], []
    for size in wanted:
        one = size_prices(size, region, refresh=refresh)
        found.append(one)
        if one.warning and one.warning not in warnings:
            warnings.append(one.warning)
    return found, warnings


def _profile_or_none(cluster: str | None) -> ClusterProfile | None:
    """The named profile (its errors raised), else the default one if there is one."""
    from hpcjob.store.config import get_profile, load_config

    if cluster is not None:
        return get_profile(cluster)
    profiles, chosen = load_config()
    return profiles.get(chosen) if chosen else None
