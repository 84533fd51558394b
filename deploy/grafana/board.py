"""The Grafana dashboard JSON that build_dashboards.py fills: a board with the datasource and
`$model` variables, its panels laid out on the grid, and the Prometheus targets they query."""

from __future__ import annotations

DS = {"type": "prometheus", "uid": "${datasource}"}
BAD = 'outcome=~"rejected|unavailable|timeout|error"'
M = 'model=~"$model"'
RI = "$__rate_interval"


def target(expr: str, legend: str = "", ref: str = "A") -> dict:
    return {"datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "refId": ref, "range": True}


class Board:
    def __init__(self, uid: str, title: str, description: str, model_var: bool = True):
        self.uid, self.title, self.description = uid, title, description
        self.model_var = model_var
        self.panels: list[dict] = []
        self._x = self._y = 0
        self._row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "id": len(self.panels) + 1,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self._y},
                "panels": [],
            }
        )
        self._y += 1

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_h
            self._x, self._row_h = 0, 0

    def panel(
        self,
        title: str,
        targets: list[tuple[str, str]],
        unit: str = "short",
        kind: str = "timeseries",
        w: int = 12,
        h: int = 8,
        description: str = "",
        **opts,
    ) -> None:
        if self._x + w > 24:
            self._newline()
        p = {
            "id": len(self.panels) + 1,
            "type": kind,
            "title": title,
            "description": description,
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self._x, "y": self._y},
            "targets": [target(e, lg, chr(ord("A") + i)) for i, (e, lg) in enumerate(targets)],
            "fieldConfig": {"defaults": {"unit": unit, **opts.pop("defaults", {})}, "overrides": []},
            "options": opts.pop("options", {}),
        }
        if kind == "timeseries":
            p["fieldConfig"]["defaults"].setdefault(
                "custom", {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
            )
            p["options"].setdefault("legend", {"displayMode": "list", "placement": "bottom", "showLegend": True})
            p["options"].setdefault("tooltip", {"mode": "multi", "sort": "desc"})
        if kind == "stat":
            p["options"].setdefault("reduceOptions", {"calcs": ["lastNotNull"], "fields": "", "values": False})
            p["options"].setdefault("colorMode", "value")
            p["options"].setdefault("graphMode", "area")
        p.update(opts)
        self.panels.append(p)
        self._x += w
        self._row_h = max(self._row_h, h)

    def json(self) -> dict:
        templating = [
            {
                "name": "datasource",
                "label": "Prometheus",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
                "regex": "",
                "options": [],
            }
        ]
        if self.model_var:
            templating.append(
                {
                    "name": "model",
                    "label": "model",
                    "type": "query",
                    "datasource": DS,
                    "query": {"query": "label_values(sloserve_requests_total, model)", "refId": "model"},
                    "definition": "label_values(sloserve_requests_total, model)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                    "refresh": 2,
                    "sort": 1,
                    "hide": 0,
                    "options": [],
                    "regex": "",
                }
            )
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["sloserve"],
            "timezone": "",
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": 39,
            "version": 1,
            "refresh": "10s",
            "time": {"from": "now-1h", "to": "now"},
            "timepicker": {},
            "templating": {"list": templating},
            "annotations": {"list": []},
            "links": [{"type": "dashboards", "tags": ["sloserve"], "asDropdown": True, "title": "sloserve"}],
            "panels": self.panels,
        }


PCT = {"min": 0, "max": 1}
