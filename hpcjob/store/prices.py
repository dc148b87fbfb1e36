"""Azure VM prices, asked for and kept: the Azure Retail Prices API (public, no sign-in), a cache of what
it said with the date asked, and the package's own table when it cannot be reached.

The API is `https://prices.azure.com/api/retail/prices` (HPCJOB_PRICES_URL names another: a mirror, or a
test's server), asked with an OData $filter on one size, one region and the Consumption price type,
page after page while it gives a NextPageLink (at most MAX_PAGES, each within TIMEOUT_S). The meters are
chosen by hpcjob.job.prices. The cache is `prices.json` in hpcjob's cache folder (~/.cache/hpcjob,
%LOCALAPPDATA%\\hpcjob\\cache on Windows): a size's prices in a region with the date they were asked for,
used for MAX_AGE_DAYS, asked again with `refresh` (`hpcjob prices --refresh`), and used past that age
when the API cannot be reached. Without either, hpcjob/azure/arm/sizes.json's approximate East US list
prices, which say their date and that they are the package's table.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hpcjob.job.prices import (
    API_URL,
    FROM_TABLE,
    SizePrices,
    check_region,
    check_size,
    choose_prices,
    price_filter,
)
from hpcjob.job.spec import HpcjobError, SpecError

PRICES_URL_ENV = "HPCJOB_PRICES_URL"
MAX_PAGES = 20
# Connecting, and each answer (seconds).
TIMEOUT_S = (5.0, 20.0)
MAX_AGE_DAYS = 7
CACHE_VERSION = 1
# The region the package's table prices are for.
TABLE_REGION = "eastus"


class PriceError(HpcjobError):
    """The API could not be asked, or its answer not read: one line."""


@dataclass(frozen=True)
class Found:
    """A size's prices and, when they are not the API's of today, why (`warning`: one line)."""

    prices: SizePrices
    warning: str | None = None


def prices_url() -> str:
    return os.environ.get(PRICES_URL_ENV) or API_URL


def cache_file() -> Path:
    from hpcjob.store.config import user_folder

    return user_folder("cache") / "prices.json"


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def ask_api(size: str, region: str, url: str | None = None, session: Any = None) -> list[dict[str, Any]]:
    """Every price row the API has for `size` in `region` (the Consumption price type), page after page.
    A NextPageLink is followed only to the host asked."""
    import requests

    base = url or prices_url()
    host = urlsplit(base).hostname
    where = f"the Azure Retail Prices API at {urlsplit(base).netloc or base}"
    get: Callable[..., Any] = session.get if session is not None else requests.get
    link: str | None = base
    params: dict[str, str] | None = {"$filter": price_filter(size, region)}
    rows: list[dict[str, Any]] = []
    for _ in range(MAX_PAGES):
        assert link is not None
        try:
            response = get(link, params=params, timeout=TIMEOUT_S)
        except requests.RequestException as exc:
            raise PriceError(f"cannot reach {where}: {_reason(exc)}") from None
        if response.status_code != 200:
            said = " ".join((response.text or "").split())[:200]
            raise PriceError(f"{where} answered HTTP {response.status_code}" + (f": {said}" if said else ""))
        try:
            body = response.json()
        except ValueError:
            raise PriceError(f"{where} answered something that is not JSON") from None
        items = body.get("Items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise PriceError(f"{where} answered JSON without an Items list")
        rows += [item for item in items if isinstance(item, dict)]
        following = body.get("NextPageLink")
        if not following:
            return rows
        if not isinstance(following, str) or urlsplit(following).hostname != host:
            raise PriceError(f"{where} gave a NextPageLink to another host: not followed")
        link, params = following, None  # the link carries the filter and the $skip
    raise PriceError(f"{where} gave more than {MAX_PAGES} pages for {size} in {region}: not read further")


def _reason(exc: BaseException) -> str:
    """A requests error in a few words: its innermost cause's."""
    inner: BaseException = exc
    while inner.__context__ is not None and inner.__context__ is not inner:
        inner = inner.__context__
    text = " ".join(str(inner).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def _read_cache() -> dict[str, dict[str, Any]]:
    """The cached prices by `size@region` ({} without a cache, or with one hpcjob cannot read)."""
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(data, dict)
        or data.get("version") != CACHE_VERSION
        or not isinstance(data.get("prices"), dict)
    ):
        return {}
    return {k: v for k, v in data["prices"].items() if isinstance(v, dict)}


def cached(size: str, region: str) -> SizePrices | None:
    try:
        return SizePrices.from_dict(_read_cache()[_key(size, region)])
    except (KeyError, ValueError):
        return None


def _key(size: str, region: str) -> str:
    return f"{size.lower()}@{region.lower()}"


def _keep(prices: SizePrices) -> None:
    """Put a size's prices in the cache, in one step; a cache that cannot be written is no error."""
    path = cache_file()
    entries = _read_cache()
    entries[_key(prices.size, prices.region)] = prices.to_dict()
    text = json.dumps({"version": CACHE_VERSION, "prices": entries}, indent=1, sort_keys=True)
    temp = None
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".prices.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temp, path)
        temp = None
    if temp is not None:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def table_prices(size: str) -> SizePrices | None:
    """The package's approximate East US list prices (hpcjob/azure/arm/sizes.json) of `size`, as its
    table's date says, in TABLE_REGION whatever the region asked for; the head node's size has its
    Windows price. None for a size it does not hold."""
    from hpcjob.azure.data import size_table

    table = size_table()
    known = {name.lower(): row.usd_per_hour for name, row in table.sizes.items()}
    known.update({name.lower(): row.usd_per_hour for name, row in table.cpu_sizes.items()})
    linux = known.get(size.lower())
    head = table.head_node_size.lower() == size.lower()
    if linux is None and not head:
        return None
    windows = table.head_node_usd_per_hour if head else None
    return SizePrices(size, TABLE_REGION, linux, None, windows, table.prices_as_of, FROM_TABLE)


def canonical_size(size: str) -> str:
    """The size as Azure spells it when the package knows it (the API's filter values are
    case-sensitive in its newer versions), else as given."""
    from hpcjob.azure.data import size_table

    table = size_table()
    for name in (*table.sizes, *table.cpu_sizes, table.head_node_size):
        if name.lower() == size.lower():
            return name
    return size


def size_prices(size: str, region: str, *, refresh: bool = False, url: str | None = None) -> Found:
    """`size`'s prices in `region`: the cache's while they are younger than MAX_AGE_DAYS (unless
    `refresh`), else the API's, kept in the cache; when the API cannot be reached, the cache's whatever
    their age, else the package's table, with a warning that says which and why. SpecError when the API
    has no price of any kind for the size in the region (an unknown size or region)."""
    check_size(size)
    check_region(region)
    size = canonical_size(size)
    kept = cached(size, region)
    if kept is not None and not refresh and _age_days(kept.asked) < MAX_AGE_DAYS:
        return Found(kept)
    try:
        rows = ask_api(size, region, url)
    except PriceError as exc:
        if kept is not None:
            return Found(kept, f"{exc}; using the prices asked for on {kept.asked}")
        table = table_prices(size)
        if table is None:
            raise PriceError(f"{exc}; and hpcjob's own table has no price for {size}") from None
        where = "" if region == TABLE_REGION else f" (its prices are East US's, not {region}'s)"
        return Found(table, f"{exc}; using hpcjob's own table of {table.asked}{where}")
    found = choose_prices(rows, size, region, today())
    if not found.any:
        raise SpecError(
            f"the Azure Retail Prices API has no price for {size} in {region}: check the size and the region "
            f"(`az vm list-skus --location {region} --size {size}` lists what the region offers)"
        )
    _keep(found)
    return Found(found)


def _age_days(asked: str) -> float:
    try:
        day = dt.date.fromisoformat(asked)
    except ValueError:
        return float("inf")
    return (dt.datetime.now(dt.UTC).date() - day).days
