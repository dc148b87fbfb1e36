"""Azure VM prices and what a run cost, pure: the Azure Retail Prices API's rows read and the meter of
each use chosen (Linux for compute nodes, Spot for Spot nodes, Windows for the head node), and a run's
cost from its nodes' task times. No I/O: hpcjob.store.prices asks the API and keeps the cache.

The rows' fields and how to tell their meters apart: shared/reference/facts/azure-retail-prices.md. A
size's on-demand Linux meter is a `Consumption` row of `1 Hour` whose productName does not end in
` Windows` and is not a Cloud Services product, and whose skuName and meterName do not end in ` Spot` or
` Low Priority`; the Windows meter ends its productName in ` Windows`; the Spot meter ends its skuName or
meterName in ` Spot`. Reservation and DevTestConsumption rows, and Low Priority (Batch) meters, are
never taken.

A run's cost is an attribution, not the bill: for every attempt and role, nodes x (task end - task
start, as the scheduler reports them) x the size's price an hour. It leaves out the head node, queue
time, the disks and the network, and what idle nodes of an always-on cluster cost between runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from hpcjob.job.spec import VM_SIZE, SpecError

if TYPE_CHECKING:
    from hpcjob.job.sizes import SizeTable

API_URL = "https://prices.azure.com/api/retail/prices"
# Azure's region names as ARM spells them (eastus, westeurope, southafricanorth): lower case, no spaces.
REGION = re.compile(r"[a-z][a-z0-9]{1,39}")
# Where a price came from.
FROM_API = "api"
FROM_TABLE = "table"
# The meters hpcjob prices nodes with.
LINUX, SPOT, WINDOWS = "linux", "spot", "windows"
HOURS_PER_SECOND = 1 / 3600
# A price an hour at or above this is no VM's (the dearest are some hundred dollars): a mistake, not a
# price. The cache's reader and the API's rows are held to the same rule (is_price).
MAX_USD_PER_HOUR = 1e6


def is_price(value: object) -> TypeGuard[float]:
    """A number of US dollars an hour: finite, not negative, under MAX_USD_PER_HOUR (not NaN, infinity,
    a bool or text)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and 0 <= value < MAX_USD_PER_HOUR
    )


def check_size(size: str, flag: str = "--size") -> None:
    if not VM_SIZE.fullmatch(size):
        raise SpecError(f"{flag} {size!r} must be an Azure VM size such as Standard_ND96isr_H100_v5")


def check_region(region: str, flag: str = "--region") -> None:
    if not REGION.fullmatch(region):
        raise SpecError(
            f"{flag} {region!r} must be an Azure region name as ARM spells it, such as eastus or westeurope "
            "(lower case, no spaces: `az account list-locations -o table` lists them)"
        )


def price_filter(size: str, region: str) -> str:
    """The API's OData $filter for one size's pay-as-you-go meters in one region (Spot and Low Priority
    meters are Consumption rows too). `size` and `region` are checked names: no quote can be in them."""
    check_size(size)
    check_region(region)
    return (
        f"serviceName eq 'Virtual Machines' and armSkuName eq '{size}' and armRegionName eq '{region}' "
        "and priceType eq 'Consumption'"
    )


def meter_of(row: Mapping[str, object]) -> str | None:
    """Which of hpcjob's meters a price row is (LINUX, SPOT or WINDOWS), or None: a reservation, a
    Dev/Test or Low Priority meter, a Windows Spot meter, a Cloud Services product, another unit or
    currency."""
    text = {key: str(row.get(key) or "") for key in ("type", "unitOfMeasure", "productName", "skuName")}
    meter = str(row.get("meterName") or "")
    if text["type"] != "Consumption" or text["unitOfMeasure"] != "1 Hour":
        return None
    if (
        str(row.get("currencyCode") or "USD") != "USD"
        or str(row.get("serviceName") or "") != "Virtual Machines"
    ):
        return None
    product, sku = text["productName"], text["skuName"]
    if "Cloud Services" in product or any(n.endswith(" Low Priority") for n in (sku, meter)):
        return None
    spot = any(n.endswith(" Spot") for n in (sku, meter))
    windows = product.endswith(" Windows")
    if spot:
        return None if windows else SPOT
    return WINDOWS if windows else LINUX


@dataclass(frozen=True)
class SizePrices:
    """One size's prices in one region, US dollars an hour (None: no such meter): on demand on Linux
    (compute nodes), Spot on Linux, on demand on Windows (the head node). `asked`: the date they were
    asked for (YYYY-MM-DD, UTC), or the package table's date; `source`: FROM_API or FROM_TABLE."""

    size: str
    region: str
    linux: float | None
    spot: float | None
    windows: float | None
    asked: str
    source: str

    @property
    def any(self) -> bool:
        return any(p is not None for p in (self.linux, self.spot, self.windows))

    def for_nodes(self, spot: bool) -> Price | None:
        """The price of compute nodes of this size: Linux, on demand or Spot."""
        per_hour = self.spot if spot else self.linux
        if per_hour is None:
            return None
        return Price(self.size, self.region, spot, per_hour, self.asked, self.source)

    def to_dict(self) -> dict[str, object]:
        return {
            "size": self.size,
            "region": self.region,
            "linux_usd_per_hour": self.linux,
            "spot_usd_per_hour": self.spot,
            "windows_usd_per_hour": self.windows,
            "asked": self.asked,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SizePrices:
        """From to_dict's form; ValueError when it is not one."""

        def price(key: str) -> float | None:
            value = data.get(key)
            if value is None:
                return None
            if not is_price(value):
                raise ValueError(f"{key} is not a price")
            return float(value)

        names = [data.get(key) for key in ("size", "region", "asked", "source")]
        if not all(isinstance(name, str) for name in names):
            raise ValueError("size, region, asked and source must be strings")
        size, region, asked, source = (str(name) for name in names)
        return cls(
            size,
            region,
            price("linux_usd_per_hour"),
            price("spot_usd_per_hour"),
            price("windows_usd_per_hour"),
            asked,
            source,
        )


def choose_prices(rows: Iterable[Mapping[str, object]], size: str, region: str, asked: str) -> SizePrices:
    """The Linux, Spot and Windows prices of `size` in `region` among the API's rows (of every page): of
    several rows of one meter, the one in force latest (effectiveStartDate), its lowest tier."""
    best: dict[str, tuple[tuple[str, float], float]] = {}
    for row in rows:
        if str(row.get("armSkuName") or "").lower() != size.lower():
            continue
        if str(row.get("armRegionName") or "").lower() != region.lower():
            continue
        meter = meter_of(row)
        price = row.get("retailPrice")
        if meter is None or not is_price(price):  # NaN, infinity, absurd: not a price
            continue
        tier = row.get("tierMinimumUnits")
        lowest = -float(tier) if isinstance(tier, int | float) and not isinstance(tier, bool) else 0.0
        key = (str(row.get("effectiveStartDate") or ""), lowest)
        if meter not in best or key > best[meter][0]:
            best[meter] = (key, float(price))

    def of(meter: str) -> float | None:
        return best[meter][1] if meter in best else None

    return SizePrices(size, region, of(LINUX), of(SPOT), of(WINDOWS), asked, FROM_API)


def table_size_prices(table: SizeTable, size: str) -> SizePrices | None:
    """The size table's prices of `size` (Linux, Spot, Windows: each only where the table holds one,
    with its source and date), in the region they are of, dated as the first of them is (the compute
    nodes' Linux price where there is one); None where the table holds no price of the size."""
    prices = table.prices_of(size)
    if not prices:
        return None
    first = next(prices[meter] for meter in (LINUX, WINDOWS, SPOT) if meter in prices)

    def of(meter: str) -> float | None:
        return prices[meter].usd_per_hour if meter in prices else None

    name = table.canonical(size)
    return SizePrices(name, first.region, of(LINUX), of(SPOT), of(WINDOWS), first.as_of, FROM_TABLE)


@dataclass(frozen=True)
class Price:
    """The price a run's nodes were counted at: a size's in a region, Spot or on demand, US dollars an
    hour, with the date it was asked for and where it came from."""

    size: str
    region: str
    spot: bool
    usd_per_hour: float
    asked: str
    source: str

    def describe(self) -> str:
        """`Standard_ND96isr_H100_v5 list price, eastus, 2026-11-27`, as the summary says it."""
        kind = "Spot price" if self.spot else "list price"
        where = f"{self.region}, {self.asked}"
        if self.source == FROM_TABLE:
            where += ", hpcjob's own table (approximate, UNVERIFIED)"
        return f"{self.size} {kind}, {where}"

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Price:
        """From asdict's form; ValueError when it is not one."""
        size, region, asked, source = (data.get(k) for k in ("size", "region", "asked", "source"))
        per_hour, spot = data.get("usd_per_hour"), data.get("spot", False)
        if not all(isinstance(name, str) for name in (size, region, asked, source)):
            raise ValueError("size, region, asked and source must be strings")
        if not is_price(per_hour) or not isinstance(spot, bool):
            raise ValueError("usd_per_hour must be a price, spot true or false")
        return cls(str(size), str(region), spot, float(per_hour), str(asked), str(source))


@dataclass(frozen=True)
class Usage:
    """Nodes of one price busy from `start` to `end` (seconds, the scheduler's clock): one node's task
    of an attempt, or several nodes of a role that started and ended together."""

    nodes: int
    start: float
    end: float
    price: Price

    @property
    def node_hours(self) -> float:
        return self.nodes * max(0.0, self.end - self.start) * HOURS_PER_SECOND

    @property
    def cost(self) -> float:
        return self.node_hours * self.price.usd_per_hour


def cost_of(usages: Sequence[Usage]) -> float:
    """What the usages cost, in US dollars: the sum over them of nodes x (end - start) x the price an
    hour. A run's usages are those of every attempt and role."""
    return sum(usage.cost for usage in usages)


def cost_per_1000_samples(usd_per_hour: float, samples_per_sec: float) -> float | None:
    """What 1,000 samples cost at a throughput: the nodes' price a second (`usd_per_hour`: all of them)
    over the samples a second they trained (None without any)."""
    if samples_per_sec <= 0:
        return None
    return usd_per_hour * HOURS_PER_SECOND / samples_per_sec * 1000


def money(usd: float | None) -> str | None:
    """`$1.23` as a person reads a cost (None: none known); under a cent, `<$0.01`, never $0.00."""
    if usd is None:
        return None
    if 0 < usd < 0.005:
        return "<$0.01"
    return f"${usd:,.2f}"
