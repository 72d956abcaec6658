"""The router's own exposition reader (router/telemetry/exposition.py) reads what prometheus_client's parser
reads, on the lines it is asked for, and refuses what is not an exposition."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.telemetry.exposition import labels, samples
from router.telemetry.load import _SCRAPED, ScrapedMetrics, parse_vllm_metrics
from tests.router.telemetry.test_health_load import VLLM_METRICS

# Histograms (with buckets that are not read), a timestamp, a name that only starts like a wanted
# one, label values holding '}', '"' and ',', and a gauge without labels.
BUSY = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a}b\\"c,d"} 7.0 1700000000000
vllm:num_requests_running{engine="1",model_name="m"} 2
# TYPE vllm:num_requests_running_peak gauge
vllm:num_requests_running_peak{engine="0"} 99.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 5.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0"} 0.5
vllm:gpu_cache_usage_perc{engine="1"} 0.75
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="4096",note="x=\\"1\\""} 1.0
"""


def reference(text: str) -> ScrapedMetrics:
    """What the router read before (prometheus_client's full parser), for comparison."""
    sums: dict[str, float] = {}
    block = blocks = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                sums[s.name] = sums.get(s.name, 0.0) + s.value
            elif s.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
                sums["usage"] = max(sums.get("usage", 0.0), s.value)
            elif s.name == "vllm:cache_config_info":
                block, blocks = int(s.labels["block_size"]), int(s.labels["num_gpu_blocks"])
    r, w = sums.get("vllm:num_requests_running"), sums.get("vllm:num_requests_waiting")
    return ScrapedMetrics(None if r is None else int(r), None if w is None else int(w), sums.get("usage"),
                          block, blocks)


@pytest.mark.parametrize("text", [VLLM_METRICS, BUSY, BUSY.replace("\n", "\r\n"), ""])
def test_reads_what_the_full_parser_reads(text: str) -> None:
    assert parse_vllm_metrics(text) == reference(text)


def test_line_breaks_tabs_and_non_finite_values() -> None:
    text = ('vllm:num_requests_running{model_name="a\u2028b\x85c"} 2\n'  # line separators inside a label value
            "vllm:num_requests_waiting\t3\n"  # a tab before the value
            "vllm:kv_cache_usage_perc NaN\n")
    assert parse_vllm_metrics(text) == ScrapedMetrics(running=2, waiting=3, kv_usage=None)
    assert parse_vllm_metrics("vllm:num_requests_running +Inf\nvllm:num_requests_waiting -1\n") == ScrapedMetrics()


def test_busy_exposition_values() -> None:
    assert parse_vllm_metrics(BUSY) == ScrapedMetrics(running=9, waiting=5, kv_usage=0.75, block_size=16,
                                                      num_gpu_blocks=4096)
    got = list(samples(BUSY, _SCRAPED))
    assert [n for n, _, _ in got].count("vllm:num_requests_running") == 2  # not the _peak gauge
    assert labels(got[0][1]) == {"engine": "0", "model_name": 'a}b"c,d'}


@pytest.mark.parametrize("text", [
    "<html><body>502 Bad Gateway</body></html>\n",
    "vllm:num_requests_running{engine=\"0\"} many\n",
    "vllm:num_requests_running{engine=\"0\" 3\n",
    "# TYPE x gauge\nx 1\nvllm:num_requests_waiting\n",
])
def test_what_is_not_an_exposition_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_vllm_metrics(text)
