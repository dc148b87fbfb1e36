"""What a run cost: Azure prices read from pages in the Retail Prices API's shape (several pages; Linux,
Windows, Spot, Low Priority, Cloud Services, Dev/Test and reservation meters; a size without a price)
served by a real HTTP server on loopback, the cache and its date, the package's table without a network,
the arithmetic, and `hpcjob prices` and `cluster add --region --spot` with their bad input."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from hpcjob.backends.local import free_port
from hpcjob.backends.scheduler import scheduler_time
from hpcjob.job.prices import (
    FROM_API,
    FROM_TABLE,
    LINUX,
    SPOT,
    WINDOWS,
    Price,
    Usage,
    choose_prices,
    cost_of,
    cost_per_1000_samples,
    meter_of,
    money,
    price_filter,
)
from hpcjob.job.results import JobSummary, NodeResult, State
from hpcjob.job.spec import SpecError
from hpcjob.store import prices as store
from hpcjob.store.prices import MAX_PAGES, PriceError, ask_api, cache_file, size_prices

from .conftest import REFERENCE, Result

PAGES = Path(__file__).resolve().parent / "azure_prices"
SAMPLES = REFERENCE / "azure-retail-prices"
H100, A100 = "Standard_ND96isr_H100_v5", "Standard_NC24ads_A100_v4"
LIVE = "https://prices.azure.com:443"


@dataclass
class PriceServer:
    """The API on loopback: the pages of tests/azure_prices by the $filter's size and region and $skip
    (an empty page for a size it has none of); `asked` holds each request's query."""

    url: str
    asked: list[dict[str, list[str]]] = field(default_factory=list)
    answer: Callable[[dict[str, list[str]]], tuple[int, bytes]] | None = None  # instead of the pages
    headers: dict[str, str] = field(default_factory=dict)  # sent with every answer (a Location)
    hosts: list[str] = field(default_factory=list)  # each request's Host header


def serve_pages(server: PriceServer, query: dict[str, list[str]]) -> tuple[int, bytes]:
    wanted = " ".join(query.get("$filter", []))
    size = re.search(r"armSkuName eq '([^']*)'", wanted)
    region = re.search(r"armRegionName eq '([^']*)'", wanted)
    page = int(query.get("$skip", ["0"])[0]) // 1000 + 1
    path = PAGES / f"{size and size[1]}-{region and region[1]}-{page}.json"
    if not path.is_file():
        empty = {"BillingCurrency": "USD", "Items": [], "NextPageLink": None, "Count": 0}
        return 200, json.dumps(empty).encode()
    base = server.url.removesuffix("/api/retail/prices")
    return 200, path.read_text(encoding="utf-8").replace(LIVE, base).encode()


@pytest.fixture
def prices_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[PriceServer]:
    """The server, and HPCJOB_PRICES_URL pointing at it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlsplit(self.path).query)
            served.asked.append(query)
            served.hosts.append(self.headers.get("Host", ""))
            status, body = (served.answer or (lambda q: serve_pages(served, q)))(query)
            self.send_response(status)
            for name, value in served.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served = PriceServer(f"http://127.0.0.1:{server.server_address[1]}/api/retail/prices")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HPCJOB_PRICES_URL", served.url)
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()


def all_rows(size: str) -> list[dict[str, Any]]:
    return [
        row for path in sorted(PAGES.glob(f"{size}-*.json")) for row in json.loads(path.read_text())["Items"]
    ]


# -- the meters ------------------------------------------------------------------------------------


def test_microsoft_s_own_sample_rows_are_none_of_the_meters_hpcjob_counts_with() -> None:
    """A Spot Windows meter of a Dev/Test offer, the same in EUR, a reservation (its price the term's)."""
    for name in ("example-consumption-devtest-spot-windows", "example-non-usd-eur", "example-reservation"):
        assert meter_of(json.loads((SAMPLES / f"{name}.json").read_text())) is None, name
    eur = json.loads((SAMPLES / "example-non-usd-eur.json").read_text())
    usd_linux = {**eur, "currencyCode": "USD", "productName": "Virtual Machines FS Series", "skuName": "F16s",
                 "meterName": "F16s"}  # fmt: skip
    assert meter_of(usd_linux) == LINUX
    assert meter_of({**usd_linux, "skuName": "F16s Spot", "meterName": "F16s Spot"}) == SPOT
    assert meter_of({**usd_linux, "productName": "Virtual Machines FS Series Windows"}) == WINDOWS
    assert meter_of({**usd_linux, "skuName": "F16s Low Priority", "meterName": "F16s Low Priority"}) is None
    assert meter_of({**usd_linux, "productName": "Virtual Machines FS Series Cloud Services"}) is None
    assert meter_of({**usd_linux, "unitOfMeasure": "1/Month"}) is None


def test_three_pages_give_the_h100_s_linux_spot_and_windows_prices() -> None:
    """The newest Linux row wins over an older one; Dev/Test, Low Priority, Cloud Services and the
    reservation are left out; Microsoft's sample row of another size and region too."""
    found = choose_prices(all_rows(H100), H100, "eastus", "2026-11-27")
    assert (found.linux, found.spot, found.windows) == (98.32, 39.328, 102.736)
    assert (found.asked, found.source) == ("2026-11-27", FROM_API)
    assert choose_prices(all_rows(H100), H100, "westeurope", "2026-11-27").any is False  # another region's
    a100 = choose_prices(all_rows(A100), A100, "eastus", "2026-11-27")
    assert (a100.linux, a100.spot, a100.windows) == (3.673, None, 3.857)
    assert a100.for_nodes(spot=True) is None and a100.for_nodes(spot=False) == Price(
        A100, "eastus", False, 3.673, "2026-11-27", FROM_API
    )


def test_the_filter_names_the_size_region_and_price_type_and_refuses_a_quote() -> None:
    assert price_filter(H100, "eastus") == (
        f"serviceName eq 'Virtual Machines' and armSkuName eq '{H100}' and armRegionName eq 'eastus' "
        "and priceType eq 'Consumption'"
    )
    with pytest.raises(SpecError, match="must be an Azure region name"):
        price_filter(H100, "eastus' or 1 eq 1")
    with pytest.raises(SpecError, match="must be an Azure VM size"):
        price_filter("Standard_X' or '", "eastus")


# -- the client, against the server ----------------------------------------------------------------


def test_the_client_follows_next_page_link_to_the_last_page(prices_api: PriceServer) -> None:
    rows = ask_api(H100, "eastus")
    assert len(rows) == 10 and len(prices_api.asked) == 3
    assert [q.get("$skip") for q in prices_api.asked] == [None, ["1000"], ["2000"]]
    assert all(q["$filter"] == [price_filter(H100, "eastus")] for q in prices_api.asked)


def test_a_size_without_a_price_is_bad_input_and_one_line(
    prices_api: PriceServer, hpcjob: Callable[..., Result]
) -> None:
    with pytest.raises(SpecError, match="has no price for Standard_NC6_v9 in eastus: check the size"):
        size_prices("Standard_NC6_v9", "eastus")
    said = hpcjob("prices", "--size", "Standard_NC6_v9", "--region", "eastus")
    assert said.code == 2 and said.out == "" and len(said.err.splitlines()) == 1, said
    assert not cache_file().exists()  # nothing kept of a size without a price


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (lambda q: (500, b"busy"), "answered HTTP 500: busy"),
        (lambda q: (429, b""), "answered HTTP 429"),
        (lambda q: (200, b"<html>"), "answered something that is not JSON"),
        (lambda q: (200, b'{"items": []}'), "answered JSON without an Items list"),
        (
            lambda q: (
                200,
                json.dumps({"Items": [], "NextPageLink": "https://elsewhere.example/x"}).encode(),
            ),
            "NextPageLink to another host: not followed",
        ),
    ],
)
def test_what_the_client_cannot_use_is_one_line(
    prices_api: PriceServer, answer: Callable[[dict[str, list[str]]], tuple[int, bytes]], says: str
) -> None:
    prices_api.answer = answer
    with pytest.raises(PriceError, match=re.escape(says)) as raised:
        ask_api(H100, "eastus")
    assert "\n" not in str(raised.value)


def test_pages_without_end_stop_at_the_page_limit(prices_api: PriceServer) -> None:
    prices_api.answer = lambda q: (200, json.dumps({"Items": [], "NextPageLink": prices_api.url}).encode())
    with pytest.raises(PriceError, match=f"more than {MAX_PAGES} pages"):
        ask_api(H100, "eastus")
    assert len(prices_api.asked) == MAX_PAGES


# -- the cache and the table -------------------------------------------------------------------------


def test_the_cache_keeps_the_date_asked_and_refresh_asks_again(
    prices_api: PriceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "today", lambda: "2026-11-27")
    first = size_prices(H100.lower(), "eastus")  # spelled as Azure spells it, in the filter and the cache
    assert first.warning is None and first.prices.size == H100 and first.prices.asked == "2026-11-27"
    assert len(prices_api.asked) == 3
    kept = json.loads(cache_file().read_text())["prices"][f"{H100.lower()}@eastus"]
    assert kept["asked"] == "2026-11-27" and kept["linux_usd_per_hour"] == 98.32
    monkeypatch.setattr(store, "today", lambda: "2026-11-30")
    monkeypatch.setattr(store, "_age_days", lambda asked: 3)
    assert size_prices(H100, "eastus").prices.asked == "2026-11-27" and len(prices_api.asked) == 3
    refreshed = size_prices(H100, "eastus", refresh=True)
    assert refreshed.prices.asked == "2026-11-30" and len(prices_api.asked) == 6
    monkeypatch.setattr(store, "_age_days", lambda asked: store.MAX_AGE_DAYS)  # too old: asked again
    assert size_prices(H100, "eastus").prices.asked == "2026-11-30" and len(prices_api.asked) == 9


def test_without_a_network_the_cache_then_the_package_table_each_saying_its_date(
    prices_api: PriceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    size_prices(A100, "eastus")
    closed = f"http://127.0.0.1:{free_port()}/api/retail/prices"  # refused: nothing listens there
    monkeypatch.setenv("HPCJOB_PRICES_URL", closed)
    stale = size_prices(A100, "eastus", refresh=True)
    assert stale.prices.linux == 3.673 and stale.prices.source == FROM_API
    assert (
        stale.warning is not None
        and "cannot reach the Azure Retail Prices API at 127.0.0.1:" in stale.warning
    )
    assert stale.warning.endswith(f"using the prices asked for on {stale.prices.asked}")
    table = size_prices(H100, "westeurope")
    assert (table.prices.source, table.prices.region, table.prices.linux) == (FROM_TABLE, "eastus", 98.32)
    assert table.prices.asked == "2026-09-12"  # the date the table's H100 price is of
    assert table.warning is not None and table.warning.endswith(
        "using hpcjob's own table of 2026-09-12 (its prices are eastus's, not westeurope's)"
    )
    price = table.prices.for_nodes(spot=False)
    assert price is not None and "hpcjob's own table (approximate, UNVERIFIED)" in price.describe()
    with pytest.raises(PriceError, match="hpcjob's own table has no price for Standard_NC6_v9"):
        size_prices("Standard_NC6_v9", "eastus")


# -- the arithmetic --------------------------------------------------------------------------------


def test_a_run_s_cost_is_nodes_times_task_time_times_the_price() -> None:
    price = Price(H100, "eastus", False, 98.32, "2026-11-27", FROM_API)
    usages = [Usage(1, 1000.0, 1000.0 + 1800, price), Usage(1, 1010.0, 1010.0 + 1800, price)]
    assert cost_of(usages) == pytest.approx(98.32)  # two nodes, half an hour each
    assert cost_of([Usage(2, 0.0, 3600.0, price), Usage(1, 50.0, 40.0, price)]) == pytest.approx(196.64)
    assert cost_of([]) == 0.0
    assert cost_per_1000_samples(2 * 98.32, 5000.0) == pytest.approx(2 * 98.32 / 3600 / 5)
    assert cost_per_1000_samples(98.32, 0.0) is None
    assert [money(v) for v in (None, 0.0, 0.004, 0.16, 1234.5)] == [
        None,
        "$0.00",
        "<$0.01",
        "$0.16",
        "$1,234.50",
    ]


def summary_with(price: Price | None) -> JobSummary:
    nodes = [
        NodeResult("GPU1", State.FINISHED, 0, task_start=100.0, task_end=100.0 + 1800),
        NodeResult("GPU2", State.FINISHED, 0, task_start=101.0, task_end=101.0 + 1800),
        NodeResult("GPU3", State.CANCELED),  # never started: no time, no cost
    ]
    return JobSummary("t", "t-1", State.FINISHED, 0, 1900.0, "/app/t", "/app/t/logs/t-1", nodes, price=price)


def test_a_summary_keeps_its_price_and_task_times_and_a_local_one_has_no_cost() -> None:
    price = Price(H100, "eastus", False, 98.32, "2026-11-27", FROM_API)
    summary = summary_with(price)
    assert summary.cost_usd == pytest.approx(98.32)
    data = json.loads(summary.to_json())
    assert data["cost_usd"] == pytest.approx(98.32) and data["price"]["usd_per_hour"] == 98.32
    assert data["nodes"][0]["task_start"] == 100.0
    again = JobSummary.from_json(summary.to_json())
    assert again.price == price and again.cost_usd == summary.cost_usd
    local = summary_with(None)
    assert local.cost_usd is None and json.loads(local.to_json())["cost_usd"] is None
    assert JobSummary.from_json(local.to_json()).price is None


def test_the_scheduler_s_times_are_read_in_either_form_and_an_unset_one_is_none() -> None:
    rest = scheduler_time("11/27/2026 9:05:07 AM")
    powershell = scheduler_time("11/27/2026 09:35:07")  # [string] of a DateTime: the invariant culture
    assert rest is not None and powershell is not None and powershell - rest == 1800
    assert scheduler_time("11/27/2026 1:00:00 PM") == scheduler_time("11/27/2026 13:00:00")
    assert [scheduler_time(t) for t in ("", "01/01/0001 00:00:00", "soon")] == [None, None, None]


# -- the commands ----------------------------------------------------------------------------------


@pytest.fixture
def hpcjob(cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path) -> Callable[..., Result]:
    """The CLI with a profile of an H100 cluster in eastus (no head node: its URL is never asked)."""
    return cli_with_profile("pw", url="https://head.example", user="alice", vm_size=H100, region="eastus")


def test_prices_shows_the_profile_s_size_and_another_s_as_a_table_and_json(
    prices_api: PriceServer, hpcjob: Callable[..., Result]
) -> None:
    shown = hpcjob("prices")
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0].split() == [
        "SIZE",
        "REGION",
        "LINUX",
        "$/H",
        "SPOT",
        "$/H",
        "WINDOWS",
        "$/H",
        "ASKED",
        "SOURCE",
    ]
    assert lines[1].split()[:5] == [H100, "eastus", "98.32", "39.328", "102.736"]
    assert lines[1].endswith("Azure Retail Prices API") and len(lines) == 2
    both = hpcjob("prices", "--size", A100, "--size", H100, "--json")
    rows = json.loads(both.out)
    assert [(r["size"], r["spot_usd_per_hour"]) for r in rows] == [(A100, None), (H100, 39.328)]
    assert len(prices_api.asked) == 4  # the H100's three pages once, then from the cache; the A100's one


def test_prices_without_a_network_says_it_shows_the_package_table(hpcjob: Callable[..., Result]) -> None:
    shown = hpcjob("prices")  # conftest points HPCJOB_PRICES_URL at a port where nothing listens
    assert shown.code == 0, shown.err
    assert shown.err.startswith("hpcjob: warning: cannot reach the Azure Retail Prices API")
    assert "hpcjob's own table of 2026-09-12" in shown.err  # the date of the table's H100 price
    assert "2026-09-12" in shown.out and "hpcjob's own table" in shown.out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--size", "H100"], "--size 'H100' must be an Azure VM size"),
        (["--region", "East US"], "--region 'East US' must be an Azure region name"),
        (["--region", "eastus;rm"], "--region 'eastus;rm' must be an Azure region name"),
    ],
)
def test_prices_refuses_bad_names_in_one_line(
    hpcjob: Callable[..., Result], args: list[str], says: str
) -> None:
    said = hpcjob("prices", *args)
    assert (said.code, said.out) == (2, "") and said.err.startswith("hpcjob: error: ")
    assert says in said.err and len(said.err.splitlines()) == 1


def test_prices_without_a_profile_asks_for_the_size_and_region(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli_with_profile: Callable[..., Callable[..., Result]]
) -> None:
    bare = cli_with_profile("pw", url="https://head.example", user="alice")
    assert "give --size SIZE: the cluster profile names no vm_size" in bare("prices").err
    said = bare("prices", "--size", H100)
    assert said.code == 2 and "give --region REGION: the cluster profile names no region" in said.err


def test_cluster_add_keeps_the_size_region_and_spot_and_refuses_a_bad_region(
    hpcjob: Callable[..., Result], tmp_path: Path
) -> None:
    common = ["cluster", "add", "spotty", "--url", "https://head2.example", "--user", "bob"]
    added = hpcjob(*common, "--vm-size", A100, "--region", "westeurope", "--spot")
    assert added.code == 0, added.err
    text = (tmp_path / "clusters.toml").read_text()
    assert 'region = "westeurope"' in text and "spot = true" in text and f'vm_size = "{A100}"' in text
    plain = hpcjob(*common, "--region", "eastus")
    assert (
        plain.code == 0
        and "spot" not in (tmp_path / "clusters.toml").read_text().split("[clusters.spotty]")[1]
    )
    for bad, says in (
        (["--region", "West Europe"], "region 'West Europe' must be"),
        (["--vm-size", "A100"], "--vm-size 'A100' must be"),
    ):
        said = hpcjob(*common, *bad)
        assert said.code == 2 and says in said.err and len(said.err.splitlines()) == 1, said


# -- a run's cost, end to end ----------------------------------------------------------------------

EMULATOR_PASSWORD = "Cost-s3cret-Pw!"
# Rank 0's last line, as the training program writes it: the run's samples/s.
METRICS = 'HPCJOB_METRICS {"epochs_trained": 1, "steps": 10, "samples_per_sec": 500.0}'


@pytest.mark.parametrize("backend", ["rest", "winrm"])
def test_a_run_on_the_emulated_cluster_is_counted_in_runs_its_json_its_summary_and_the_plot(
    backend: str,
    prices_api: PriceServer,
    cli_with_profile: Callable[..., Callable[..., Result]],
    tmp_path: Path,
) -> None:
    """Two nodes' tasks of about two seconds each, at the H100's list price in eastus: each front door
    of the head node gives the tasks' StartTime and EndTime. A local run has no cost: `-`, null."""
    from hpcjob.emulator import HeadNode

    from .conftest import empty_script, stand_in_python
    from .test_winrm import winrm_profile

    share = tmp_path / "share"
    share.mkdir()
    python = stand_in_python(tmp_path, f"sleep 2; echo '{METRICS}'")
    run_id = f"cost-{backend}"
    with HeadNode(users={"alice": EMULATOR_PASSWORD}, grace_period=2.0) as head:
        profile = {**winrm_profile(head, share, "HPC\\alice"), "backend": backend}
        hpcjob = cli_with_profile(
            EMULATOR_PASSWORD, **profile, node_group="GPUNodes", vm_size=H100, region="eastus"
        )
        job = ["--no-mount-step", "--python", str(python), str(empty_script(tmp_path))]
        done = hpcjob("submit", "--wait", "-n", "2", "--run-id", run_id, *job)
    assert done.code == 0, done.err
    [said] = [line.strip() for line in done.out.splitlines() if line.strip().startswith("cost ≈ $")]
    assert said.endswith(f"at {H100} list price, eastus, {store.today()}"), said
    [run] = [r for r in json.loads(hpcjob("runs", "--json").out) if r["run_id"] == run_id]
    assert 2 * 98.32 / 3600 <= run["cost_usd"] <= 2 * 4 * 98.32 / 3600, run  # 1 to 4 s a node
    assert run["price"] == {"size": H100, "region": "eastus", "spot": False, "usd_per_hour": 98.32,
                            "asked": store.today(), "source": FROM_API}  # fmt: skip
    assert run["cost_per_1000_samples_usd"] == pytest.approx(2 * 98.32 / 3600 / 500 * 1000)
    nodes = run["summary"]["nodes"]
    assert all(1 <= n["task_end"] - n["task_start"] <= 4 for n in nodes), nodes
    table = hpcjob("runs").out.splitlines()
    assert "COST" in table[0].split()
    [row] = [line for line in table if line.startswith(run_id)]
    assert money(run["cost_usd"]) in row.split()
    shown = hpcjob("runs", "show", run_id).out
    assert f"  cost:     cost ≈ {money(run['cost_usd'])} at {H100} list price" in shown
    assert "(an attribution, not the bill)" in shown
    plotted = hpcjob("runs", "plot", run_id, "-o", str(tmp_path / "cost.png"))
    assert plotted.code == 0, plotted.err
    assert "cost (USD) against samples/s" in plotted.out and "cost per 1,000 samples (USD)" in plotted.out


# -- prices are numbers, from the host asked ---------------------------------------------------------


def test_nan_infinity_and_absurd_prices_from_the_api_are_refused_as_the_cache_refuses_them(
    prices_api: PriceServer,
) -> None:
    """Python's json reads NaN and Infinity: a row of either, or of a price no VM has, is no price (the
    cache's reader, SizePrices.from_dict, refuses the same)."""
    rows = json.loads((PAGES / f"{A100}-eastus-1.json").read_text())["Items"]
    linux, windows = rows
    spot = {**linux, "skuName": f"{linux['skuName']} Spot", "meterName": f"{linux['meterName']} Spot"}
    bad = [{**linux, "retailPrice": float("nan")}, {**spot, "retailPrice": float("inf")},
           {**windows, "retailPrice": 5e9}]  # fmt: skip
    page = {"BillingCurrency": "USD", "Items": bad, "NextPageLink": None, "Count": 3}
    prices_api.answer = lambda query: (200, json.dumps(page).encode())  # NaN and Infinity as literals
    with pytest.raises(SpecError, match="has no price for Standard_NC24ads_A100_v4 in eastus"):
        size_prices(A100, "eastus")
    assert not cache_file().exists()  # nothing kept
    page["Items"] = [*bad, linux]  # one real price among them
    found = size_prices(A100, "eastus", refresh=True)
    assert (found.prices.linux, found.prices.spot, found.prices.windows) == (3.673, None, None)
    kept = json.loads(cache_file().read_text())["prices"]
    assert kept["standard_nc24ads_a100_v4@eastus"]["spot_usd_per_hour"] is None
    for value in (float("nan"), float("inf"), -1.0, 1e6, True, "3.5"):
        with pytest.raises(ValueError, match="not a price"):
            store.SizePrices.from_dict({**found.prices.to_dict(), "linux_usd_per_hour": value})


def test_a_redirect_to_another_host_is_not_followed_and_one_on_the_host_asked_is(
    prices_api: PriceServer,
) -> None:
    other = prices_api.url.replace("127.0.0.1", "localhost")  # this very server, by another host name
    prices_api.answer = lambda query: (302, b"")
    prices_api.headers["Location"] = f"{other}?$filter=x"
    with pytest.raises(PriceError, match=r"redirected to another host \(localhost:\d+\): not followed"):
        ask_api(A100, "eastus")
    assert prices_api.hosts == [urlsplit(prices_api.url).netloc]  # localhost never asked

    moved = prices_api.url.replace("/api/retail/prices", "/moved/prices")

    def answer(query: dict[str, list[str]]) -> tuple[int, bytes]:
        if len(prices_api.asked) == 1:  # the first request: moved, on the same host, with its query
            return 301, b""
        prices_api.headers.pop("Location", None)
        return serve_pages(prices_api, query)

    prices_api.asked.clear()
    filtered = price_filter(A100, "eastus").replace(" ", "%20").replace("'", "%27")
    prices_api.headers["Location"] = f"{moved}?$filter={filtered}"
    prices_api.answer = answer
    assert [row["retailPrice"] for row in ask_api(A100, "eastus")] == [3.673, 3.857]
    assert len(prices_api.asked) == 2


# -- one answer to what a size costs an hour -------------------------------------------------------


def test_without_the_network_the_cache_then_the_table_answer_and_the_api_is_not_asked(
    prices_api: PriceServer,
) -> None:
    from hpcjob.store.prices import NO_SPOT_OFFLINE, hourly_price

    offline = hourly_price(H100, "eastus", LINUX, network=False)
    assert (offline.usd_per_hour, offline.prices and offline.prices.source) == (98.32, FROM_TABLE)
    assert offline.approximate and prices_api.asked == []
    spot = hourly_price(H100, "eastus", SPOT, network=False)
    assert (spot.usd_per_hour, spot.unknown, spot.price()) == (None, NO_SPOT_OFFLINE, None)
    assert prices_api.asked == []
    online = hourly_price(H100, "eastus", SPOT)  # the API: its Spot meter, kept in the cache
    assert online.usd_per_hour == 39.328 and not online.approximate and len(prices_api.asked) == 3
    kept = hourly_price(H100, "eastus", SPOT, network=False)  # now the cache's, whatever its age
    assert (kept.usd_per_hour, kept.prices and kept.prices.source) == (39.328, FROM_API)
    assert len(prices_api.asked) == 3


def test_offline_a_spot_node_is_priced_only_from_a_sourced_spot_price_in_the_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The packaged table holds no Spot price (none has a source): a Spot cluster's run is "unknown (no
    Spot price offline)"; a table that holds one with its source and date prices it."""
    import dataclasses

    from hpcjob.runner.cost import node_price
    from hpcjob.store.config import ClusterProfile

    profile = ClusterProfile("gpu", "https://head", "alice", vm_size=A100, region="eastus", spot=True)
    said: list[str] = []
    assert node_price(profile, said.append) is None
    assert said[-1] == "hpcjob: warning: the run's cost is not counted: unknown (no Spot price offline)"
    from hpcjob.job import sizes

    table = sizes.size_table()
    spot = sizes.TablePrice(1.1, "eastus", "2026-11-28", "a test's own source")
    a100 = dataclasses.replace(table.sizes[A100], prices={**table.sizes[A100].prices, SPOT: spot})
    monkeypatch.setattr(sizes, "size_table", lambda: dataclasses.replace(table, sizes={A100: a100}))
    said.clear()
    price = node_price(profile, said.append)
    assert price is not None and (price.usd_per_hour, price.spot, price.source) == (1.1, True, FROM_TABLE)
    assert not any("not counted" in line for line in said)


def test_onboarding_and_cluster_list_price_from_the_cache_as_runs_do() -> None:
    """Onboarding's cost line asks the same answer as a run's cost: a price in the cache for the region
    wins over the package's table (East US's)."""
    from hpcjob.azure.template import OnboardRequest, hourly_cost
    from hpcjob.job.sizes import size_table
    from hpcjob.store.power import NodeKind, PowerRecord
    from hpcjob.store.power import hourly_cost as cluster_cost

    region = "westeurope"
    store._keep(store.SizePrices(A100, region, 5.0, 2.0, 6.0, "2026-11-28", FROM_API))
    store._keep(store.SizePrices("Standard_DS4_v2", region, 1.0, None, 2.0, "2026-11-28", FROM_API))
    line = hourly_cost(OnboardRequest("gpu", "rg", region, A100, 2), size_table())
    assert line.startswith(
        "about $12.00 an hour while it runs (2 x Standard_NC24ads_A100_v4 at $5.00 and the head node at "
        "$2.00; the Azure Retail Prices API, asked 2026-11-28"
    )
    spot_line = hourly_cost(OnboardRequest("gpu", "rg", region, A100, 2, spot=True), size_table())
    assert "each Spot node the Spot price of the hour, about $2.00" in spot_line
    nodes = (NodeKind(A100, False, 2), NodeKind(A100, True, 1))
    cost = cluster_cost(PowerRecord("gpu", "rg", "running", "2026-11-28T00:00:00+00:00", nodes,
                                    "Standard_DS4_v2", region))  # fmt: skip
    assert (cost.nodes, cost.head, cost.approximate, cost.unknown) == (12.0, 2.0, False, ())
    offline = hourly_cost(OnboardRequest("gpu", "rg", "eastus", A100, 2, spot=True), size_table())
    assert "each Spot node the Spot price of the hour, unknown (no Spot price offline)" in offline


def test_max_cost_says_before_the_first_attempt_that_it_cannot_bound_a_run_without_a_price(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from hpcjob.runner import Retries
    from hpcjob.runner import submit as steps
    from hpcjob.store.config import ClusterProfile

    class Submitted(Exception):
        """submit_run was reached: the first attempt."""

    said: list[str] = []

    def first_attempt(*args: object, **kwargs: object) -> None:
        said.append("<first attempt>")
        raise Submitted

    monkeypatch.setattr(steps, "submit_run", first_attempt)
    profile = ClusterProfile("gpu", "https://head", "alice", vm_size=A100, region="eastus", spot=True)
    access: Any = SimpleNamespace(profile=profile, backend=None)
    spec: Any = SimpleNamespace(share=None, data_nodes=0)
    with pytest.raises(Submitted):
        steps.submit_and_follow(
            access, spec, "run-1", (None, None, 445), mount_step=False, wait=True, progress=said.append,
            command="hpcjob submit", retries=Retries(2, max_cost_usd=10.0),
        )  # fmt: skip
    assert said[-2:] == [
        "hpcjob: warning: --max-cost 10 cannot bound run run-1: unknown (no Spot price offline); its "
        "attempts go on as --retries says",
        "<first attempt>",
    ]
    said.clear()
    with pytest.raises(Submitted):  # on demand: the table's price bounds it, nothing said
        steps.submit_and_follow(
            SimpleNamespace(profile=ClusterProfile("gpu", "https://head", "alice", vm_size=A100,
                                                   region="eastus"), backend=None),
            spec, "run-2", (None, None, 445), mount_step=False, wait=True, progress=said.append,
            command="hpcjob submit", retries=Retries(2, max_cost_usd=10.0),
        )  # fmt: skip
    assert not any("--max-cost" in line for line in said)
