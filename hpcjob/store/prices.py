"""Azure VM prices, asked for and kept: the Azure Retail Prices API (public, no sign-in), a cache of what
it said with the date asked, and the package's own table when it cannot be reached.

The API is `https://prices.azure.com/api/retail/prices` (HPCJOB_PRICES_URL names another: a mirror, or a
test's server), asked with an OData $filter on one size, one region and the Consumption price type,
page after page while it gives a NextPageLink (at most MAX_PAGES, each within TIMEOUT_S). The meters are
chosen by hpcjob.job.prices. The cache is `prices.json` in hpcjob's cache folder (~/.cache/hpcjob,
%LOCALAPPDATA%\\hpcjob\\cache on Windows): a size's prices in a region with the date they were asked for,
used for MAX_AGE_DAYS, asked again with `refresh` (`hpcjob prices --refresh`), and used past that age
when the API cannot be reached. Without either, the size table's prices (hpcjob/job/sizes.json), each with
its date and source; the table has a Spot price only where a source gives one, so offline a Spot node's
price is otherwise unknown.

One question, one answer: "what does size S cost an hour in region R" is `hourly_price` (and the three
meters at once, `size_prices`). Onboarding, `cluster list`, `cluster stop`/`start`, a run's cost and
`--max-cost` all ask it; those that must not wait on the network say so (`network=False`: the cache,
whatever its age, else the table).
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
    LINUX,
    SPOT,
    WINDOWS,
    Price,
    SizePrices,
    check_region,
    check_size,
    choose_prices,
    price_filter,
    table_size_prices,
)
from hpcjob.job.spec import HpcjobError, SpecError

PRICES_URL_ENV = "HPCJOB_PRICES_URL"
MAX_PAGES = 20
# Connecting, and each answer (seconds).
TIMEOUT_S = (5.0, 20.0)
MAX_AGE_DAYS = 7
CACHE_VERSION = 1
# Redirects followed to the host asked (another host's: not followed).
MAX_REDIRECTS = 5
# What a Spot node costs where only the package's table could be read and it has no Spot price.
NO_SPOT_OFFLINE = "unknown (no Spot price offline)"


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
    from hpcjob.store.folders import user_folder

    return user_folder("cache") / "prices.json"


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def ask_api(size: str, region: str, url: str | None = None, session: Any = None) -> list[dict[str, Any]]:
    """Every price row the API has for `size` in `region` (the Consumption price type), page after page.
    A NextPageLink, and an HTTP redirect, is followed only to the host asked."""
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
            response = _get_on_host(get, link, params, host, where)
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


def _get_on_host(
    get: Callable[..., Any], link: str, params: dict[str, str] | None, host: str | None, where: str
) -> Any:
    """GET `link`, following a redirect only to `host` (the one asked): a redirect elsewhere could
    send the prices of anyone's choosing, so it is refused, as a NextPageLink to another host is."""
    from urllib.parse import urljoin

    for _ in range(MAX_REDIRECTS + 1):
        response = get(link, params=params, timeout=TIMEOUT_S, allow_redirects=False)
        if response.status_code not in (301, 302, 303, 307, 308):
            return response
        target = urljoin(link, str(response.headers.get("Location") or ""))
        if urlsplit(target).hostname != host:
            raise PriceError(f"{where} redirected to another host ({urlsplit(target).netloc}): not followed")
        link, params = target, None  # the target carries its own query
    raise PriceError(f"{where} redirected more than {MAX_REDIRECTS} times: not followed further")


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
    """The size table's prices of `size` (hpcjob/job/sizes.json), each of its own date and source, in the
    region they are of whatever the region asked for; None for a size the table holds no price of."""
    from hpcjob.job.sizes import size_table

    return table_size_prices(size_table(), size)


def canonical_size(size: str) -> str:
    """The size as Azure spells it when the table knows it (the API's filter values are case-sensitive
    in its newer versions), else as given."""
    from hpcjob.job.sizes import size_table

    return size_table().canonical(size)


def size_prices(
    size: str, region: str, *, refresh: bool = False, url: str | None = None, network: bool = True
) -> Found:
    """`size`'s prices in `region`: the cache's while they are younger than MAX_AGE_DAYS (unless
    `refresh`), else the API's, kept in the cache; when the API cannot be reached (or without `network`),
    the cache's whatever their age, else the package's table, with a warning that says which and why.
    SpecError when the API has no price of any kind for the size in the region (an unknown size or
    region); PriceError when neither the API, the cache nor the table has one."""
    check_size(size)
    check_region(region)
    size = canonical_size(size)
    kept = cached(size, region)
    if kept is not None and (not network or (not refresh and _age_days(kept.asked) < MAX_AGE_DAYS)):
        return Found(kept)
    try:
        if not network:
            raise PriceError("the Azure Retail Prices API was not asked (no network here)")
        rows = ask_api(size, region, url)
    except PriceError as exc:
        if kept is not None:
            return Found(kept, f"{exc}; using the prices asked for on {kept.asked}")
        table = table_prices(size)
        if table is None:
            raise PriceError(f"{exc}; and hpcjob's own table has no price for {size}") from None
        where = "" if region == table.region else f" (its prices are {table.region}'s, not {region}'s)"
        return Found(table, f"{exc}; using hpcjob's own table of {table.asked}{where}")
    found = choose_prices(rows, size, region, today())
    if not found.any:
        raise SpecError(
            f"the Azure Retail Prices API has no price for {size} in {region}: check the size and the region "
            f"(`az vm list-skus --location {region} --size {size}` lists what the region offers)"
        )
    _keep(found)
    return Found(found)


@dataclass(frozen=True)
class HourlyPrice:
    """What `size` costs an hour in `region` on one meter (LINUX, SPOT or WINDOWS), in US dollars, or
    None with `unknown` saying why in a few words; `prices`: the size's prices it was read from, and
    `warning`: why they are not the API's of today (one line), where they are not."""

    size: str
    region: str
    meter: str
    usd_per_hour: float | None
    prices: SizePrices | None = None
    warning: str | None = None
    unknown: str | None = None

    @property
    def approximate(self) -> bool:
        """The package's table's price, or another region's."""
        found = self.prices
        return found is not None and (found.source == FROM_TABLE or found.region != self.region)

    def price(self) -> Price | None:
        """The price nodes are counted at (LINUX or SPOT; None without one)."""
        if self.prices is None or self.usd_per_hour is None or self.meter == WINDOWS:
            return None
        return self.prices.for_nodes(self.meter == SPOT)


def hourly_price(
    size: str | None, region: str | None, meter: str, *, network: bool = True, refresh: bool = False
) -> HourlyPrice:
    """What `size` costs an hour in `region` on `meter` (LINUX, SPOT, WINDOWS): the API's, then the
    cache's, then the package's table's (`size_prices`); `network=False`: the cache, then the table,
    nothing asked. Never raises for want of a price: `unknown` says why there is none."""
    if not size or not region:
        missing = " and ".join(what for what, given in (("size", size), ("region", region)) if not given)
        return HourlyPrice(size or "", region or "", meter, None, unknown=f"no {missing} known")
    try:
        found = size_prices(size, region, network=network, refresh=refresh)
    except HpcjobError as exc:  # a SpecError too: the size is not the user's input here
        return HourlyPrice(size, region, meter, None, unknown=" ".join(str(exc).split()))
    prices = found.prices
    value: float | None = {LINUX: prices.linux, SPOT: prices.spot, WINDOWS: prices.windows}[meter]
    unknown = None
    if value is None:
        kind = {LINUX: "Linux", SPOT: "Spot", WINDOWS: "Windows"}[meter]
        offline = meter == SPOT and prices.source == FROM_TABLE
        unknown = NO_SPOT_OFFLINE if offline else f"no {kind} price for {prices.size} in {prices.region}"
    return HourlyPrice(prices.size, region, meter, value, prices, found.warning, unknown)


def _age_days(asked: str) -> float:
    try:
        day = dt.date.fromisoformat(asked)
    except ValueError:
        return float("inf")
    return (dt.datetime.now(dt.UTC).date() - day).days
