"""Chart data of a matplotlib figure, as E2B's code interpreter attaches it
to a shown figure's result (the `e2b/chart` MIME type, `Result.chart` in the
SDKs): the chart's kind, title, axis labels and units, ticks and scales, and
its data points, bars, wedges or boxes.

The Python kernel (python_kernel.py) receives this source as its first
argument and loads it on the first figure it shows, so a kernel that never
plots never pays for it. `chart(figure)` is the one entry point; it returns
a JSON-ready dict, or None for a figure with nothing plotted. Only
matplotlib's public artists are read; nothing is drawn or changed.
"""
import datetime
import math
import re

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")  # "Time (s)" or "Time [s]"
_AUTO_LINE = re.compile(r"^_child(\d+)$")  # an unlabelled line's automatic label
_AUTO_GROUP = re.compile(r"^_container(\d+)$")  # an unlabelled bar container's


def chart(figure):
    axes = [ax for ax in figure.get_axes() if ax.get_visible()]
    if not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return _axes_chart(axes[0])
    suptitle = getattr(figure, "_suptitle", None)
    return {"type": "superchart", "title": _text(suptitle.get_text() if suptitle is not None else ""),
            "elements": [_axes_chart(ax) for ax in axes]}


def _text(s):
    return s if s else None


def _num(v):
    """A JSON number (or an ISO date string) for one data value."""
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    kind = type(v).__name__
    if kind == "datetime64":
        return str(v.astype("datetime64[s]"))
    if isinstance(v, str):
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else None


def _round(v):
    """Ten significant digits: geometry read back from patches carries float
    noise (a 90 % wedge is 323.99999999999994 degrees)."""
    return float("%.10g" % v)


def _kind(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    artists = [a for a in getattr(ax, "_children", ax.lines + ax.patches + ax.collections)
               if not isinstance(a, Text)]
    if all(isinstance(a, Line2D) for a in artists):
        return "line"
    if all(isinstance(a, (PathPatch, Line2D)) for a in artists):
        return "box_and_whisker"  # boxplot(patch_artist=True): boxes, whiskers, caps, medians
    artists = [a for a in artists if not (isinstance(a, Line2D) and _is_rule(a))]
    for kind, cls in (("scatter", PathCollection), ("pie", Wedge), ("bar", Rectangle)):
        if artists and all(isinstance(a, cls) for a in artists):
            return kind
    return "unknown"


def _is_rule(line):
    """A two-point horizontal or vertical line (axhline, axvline, a grid line)."""
    xs, ys = list(line.get_xdata()), list(line.get_ydata())
    return len(xs) == 2 and len(ys) == 2 and (xs[0] == xs[1] or ys[0] == ys[1])


def _axes_chart(ax):
    kind = _kind(ax)
    out = {"type": kind, "title": _text(ax.get_title()), "elements": []}
    if kind in ("pie", "unknown"):
        if kind == "pie":
            out["elements"] = _wedges(ax)
        return out
    out.update(_labels(ax))
    if kind in ("line", "scatter"):
        out.update(_axis(ax, "x"))
        out.update(_axis(ax, "y"))
        out["elements"] = _lines(ax) if kind == "line" else _scatters(ax)
    elif kind == "bar":
        out["elements"] = _bars(ax, out)
    else:
        out["elements"] = _boxes(ax, out)
    return out


def _labels(ax):
    out = {}
    for axis, label in (("x", ax.get_xlabel()), ("y", ax.get_ylabel())):
        out[axis + "_label"] = _text(label)
        m = _UNIT.search(label or "")
        out[axis + "_unit"] = (m.group(1) or m.group(2)) if m else None
    return out


def _swap_axes(out):
    """A chart drawn sideways (barh, vert=False boxes): x names the categories."""
    for field in ("label", "unit"):
        out["x_" + field], out["y_" + field] = out["y_" + field], out["x_" + field]


def _converter(axis):
    getter = getattr(axis, "get_converter", None)
    return getter() if getter else getattr(axis, "converter", None)


def _axis(ax, name):
    """Ticks, tick labels and scale of one axis: `datetime` where a date
    converter maps the data, `categorical` where strings were plotted,
    otherwise matplotlib's scale name (`linear`, `log`, `symlog`, ...)."""
    axis = getattr(ax, name + "axis")
    conv = type(_converter(axis)).__name__
    locs = list(axis.get_ticklocs())
    if "Date" in conv:
        from matplotlib.dates import num2date
        scale, ticks = "datetime", [num2date(t).isoformat() for t in locs]
    else:
        scale = "categorical" if "Category" in conv else axis.get_scale()
        ticks = [_num(t) for t in locs]
    return {name + "_ticks": ticks, name + "_scale": scale,
            name + "_tick_labels": [t.get_text() for t in axis.get_ticklabels()]}


def _lines(ax):
    out = []
    for line in ax.get_lines():
        if _is_rule(line):
            continue
        label = str(line.get_label())
        auto = _AUTO_LINE.match(label)
        out.append({"label": "Line %s" % auto.group(1) if auto else label,
                    "points": [[_num(x), _num(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]})
    return out


def _scatters(ax):
    return [{"label": str(c.get_label()), "points": [[_num(x), _num(y)] for x, y in c.get_offsets()]}
            for c in ax.collections]


def _tick_label_at(axis, position):
    """The tick label drawn at `position` on `axis` (a bar's or box's
    category), or the position itself when no tick sits there."""
    for loc, label in zip(axis.get_ticklocs(), axis.get_ticklabels()):
        if abs(loc - position) < 1e-9:
            return label.get_text()
    return "%g" % position


def _bars(ax, out):
    from matplotlib.container import BarContainer

    bars = []
    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    sideways = bool(containers) and all(getattr(c, "orientation", None) == "horizontal" for c in containers)
    if sideways:
        _swap_axes(out)
    for i, container in enumerate(containers):
        group = str(container.get_label())
        auto = _AUTO_GROUP.match(group)
        group = "Group %s" % auto.group(1) if auto else group
        values = getattr(container, "datavalues", None)
        for j, rect in enumerate(container.patches):
            if sideways:
                where, axis, size = rect.get_y() + rect.get_height() / 2, ax.yaxis, rect.get_width()
            else:
                where, axis, size = rect.get_x() + rect.get_width() / 2, ax.xaxis, rect.get_height()
            value = values[j] if values is not None and j < len(values) else size
            bars.append({"label": _tick_label_at(axis, where), "group": group, "value": _num(value)})
    return bars


def _boxes(ax, out):
    """Boxes of boxplot(patch_artist=True), read back from its artists: each
    box patch spans the quartiles; a whisker is a line along the value axis
    from a quartile to the extreme; the median a line across the whole box;
    fliers a marker-only line."""
    from matplotlib.patches import PathPatch

    patches = [p for p in ax.patches if isinstance(p, PathPatch)]
    # A median spans its box across the category axis: a horizontal line as
    # wide as a box means upright boxes (whiskers and caps fit either way).
    spans = {(_round(min(v[:, 0])), _round(max(v[:, 0]))) for v in (p.get_path().vertices for p in patches)}
    upright = any(len(xs) == 2 and len(ys) == 2 and ys[0] == ys[1] and (_round(min(xs)), _round(max(xs))) in spans
                  for xs, ys in ((list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()))
    if not upright:
        _swap_axes(out)
    boxes = []
    for p in patches:
        v = p.get_path().vertices
        pos, val = (v[:, 0], v[:, 1]) if upright else (v[:, 1], v[:, 0])
        boxes.append({"lo": min(pos), "hi": max(pos), "q1": _round(min(val)), "q3": _round(max(val)),
                      "median": None, "min": None, "max": None, "outliers": []})
    for line in ax.get_lines():
        xs, ys = [float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()]
        pos, val = (xs, ys) if upright else (ys, xs)
        if not pos:
            continue
        box = next((b for b in boxes if b["lo"] - 1e-9 <= min(pos) and max(pos) <= b["hi"] + 1e-9), None)
        if box is None:
            continue
        if line.get_linestyle() in ("None", "none", "", " "):
            box["outliers"].extend(_round(x) for x in val)
        elif len(pos) == 2 and val[0] == val[1] and abs((pos[1] - pos[0]) - (box["hi"] - box["lo"])) < 1e-9:
            box["median"] = _round(val[0])
        elif len(pos) == 2 and pos[0] == pos[1]:
            lo, hi = _round(min(val)), _round(max(val))
            if hi <= box["q1"]:
                box["min"] = lo
            elif lo >= box["q3"]:
                box["max"] = hi
    axis = ax.xaxis if upright else ax.yaxis
    return [{"label": _tick_label_at(axis, (b["lo"] + b["hi"]) / 2), "min": b["min"], "first_quartile": b["q1"],
             "median": b["median"], "third_quartile": b["q3"], "max": b["max"], "outliers": b["outliers"]}
            for b in boxes]


def _wedges(ax):
    from matplotlib.patches import Wedge

    # Wedge angles carry single-precision noise (a 90 % slice is 323.99999
    # degrees): a ten-thousandth of a degree is plenty.
    return [{"label": str(w.get_label()), "angle": round(abs(w.theta2 - w.theta1), 4), "radius": _num(w.r)}
            for w in ax.patches if isinstance(w, Wedge)]
