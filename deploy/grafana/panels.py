"""The pieces the dashboards of build_dashboards.py are made of, on Grafana's typed builders
(``grafana-foundation-sdk``): the datasource, the label filters, a target, time-series, stat and heatmap
panels with units, and a board with its ``$datasource`` and ``$model`` variables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT = Path(__file__).resolve().parent / "dashboards"

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
BAD = 'outcome=~"rejected|unavailable|timeout|error"'
M = 'model=~"$model"'
RI = "$__rate_interval"
# Latency histograms: a time series or heatmap panel that reads their buckets asks Prometheus for
# exemplars too, which Grafana links to the trace (deploy/grafana/provisioning/datasources/).
LATENCY_HISTOGRAMS = ("sloserve_request_duration_seconds_bucket", "sloserve_training_reclaim_seconds_bucket")

Query = tuple[str, str]  # (PromQL, legend)
Item = timeseries.Panel | stat.Panel | heatmap.Panel | str  # a panel, or the title of a row that starts here


def target(expr: str, legend: str, ref: str, exemplars: bool, fmt: PromQueryFormat | None = None):
    q = prometheus.Dataquery().datasource(DS).expr(expr).legend_format(legend or "__auto").ref_id(ref).range()
    if exemplars and any(h in expr for h in LATENCY_HISTOGRAMS):
        q = q.exemplar(True)
    if fmt is not None:
        q = q.format(fmt)
    return q


def _panel(p, title: str, queries: Sequence[Query], unit: str, w: int, h: int, description: str, pct: bool, **kw):
    p = p.title(title).datasource(DS).unit(unit).span(w).height(h)
    if description:
        p = p.description(description)
    if pct:
        p = p.min(0).max(1)
    for i, (expr, legend) in enumerate(queries):
        p = p.with_target(target(expr, legend, chr(ord("A") + i), **kw))
    return p


def series(
    title: str,
    queries: Sequence[Query],
    unit: str,
    *,
    description: str = "",
    pct: bool = False,
    stacked: bool = False,
    w: int = 12,
    h: int = 8,
) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .line_width(1)
        .fill_opacity(10)
        .show_points(cm.VisibilityMode.NEVER)
        .legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
    )
    if stacked:
        p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    return _panel(p, title, queries, unit, w, h, description, pct, exemplars=True)


def single(
    title: str,
    query: Query,
    unit: str,
    *,
    description: str = "",
    pct: bool = False,
    decimals: int | None = None,
    steps: Sequence[tuple[float | None, str]] = (),
) -> stat.Panel:
    """A w=4, h=4 stat of the last value (no exemplars: a stat does not draw them)."""
    p = (
        stat.Panel()
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(cm.BigValueColorMode.VALUE)
        .graph_mode(cm.BigValueGraphMode.AREA)
    )
    if decimals is not None:
        p = p.decimals(decimals)
    if steps:
        p = p.thresholds(
            db.ThresholdsConfig()
            .mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=v, color=c) for v, c in steps])
        )
    return _panel(p, title, [query], unit, 4, 4, description, pct, exemplars=False)


def latency_heatmap(title: str, query: Query, *, w: int = 12, h: int = 8) -> heatmap.Panel:
    """Prometheus histogram buckets drawn as they are (Grafana does not re-bucket them)."""
    p = (
        heatmap.Panel()
        .calculate(False)
        .cell_gap(1)
        .y_axis(heatmap.YAxisConfig().unit("s"))
        .color(
            heatmap.HeatmapColorOptions()
            .mode(hm.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .fill("dark-orange")
            .scale(hm.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .show_tooltip()
        .show_legend()
    )
    return _panel(p, title, [query], "reqps", w, h, "", False, exemplars=True, fmt=PromQueryFormat.HEATMAP)


def board(uid: str, title: str, description: str, items: Iterable[Item], model_var: bool = True) -> db.Dashboard:
    """A dashboard with the datasource (and `$model`) variables; the SDK lays `items` out on the grid,
    a string starting a (non-collapsed) row. Panels are numbered in order."""
    d = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["sloserve"])
        .timezone("")
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("10s")
        .time("now-1h", "now")
        .version(1)
        .link(db.DashboardLink("sloserve").type(dm.DashboardLinkType.DASHBOARDS).tags(["sloserve"]).as_dropdown(True))
        .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )
    if model_var:
        d = d.with_variable(
            db.QueryVariable("model")
            .label("model")
            .datasource(DS)
            .query("label_values(sloserve_requests_total, model)")
            .include_all(True)
            .multi(True)
            .all_value(".*")
            .current(dm.VariableOption(text="All", value="$__all", selected=True))
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
        )
    for i, item in enumerate(items, 1):
        d = d.with_row(db.Row(item).id(i)) if isinstance(item, str) else d.with_panel(item.id(i))
    return d
