"""stats: counts per type/source/hour and dead-letter error reasons → Parquet + CSV and a PNG chart."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

TOP_TYPES = 8


def run_stats(events: DataFrame, out_dir: str | Path, *, title: str = "") -> dict[str, Any]:
    """Aggregate decoded events (a topic window or an archive) into ``out_dir``; returns a summary."""
    from pyspark.sql import functions as F

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    good = events.where(F.col("error").isNull())
    when = F.coalesce(F.col("time"), F.col("timestamp"))
    counts = (good.groupBy(F.date_trunc("hour", when).alias("hour"), "type", "source").count()
              .orderBy("hour", "type", "source"))
    ext = F.col("extensions")
    errors = (
        good.where(ext.getItem("knativeerrorcode").isNotNull() | ext.getItem("knativeerrordest").isNotNull())
        .groupBy(
            ext.getItem("knativeerrorcode").alias("code"),
            ext.getItem("knativeerrordest").alias("destination"),
            # knativeerrordata is the subscriber's response body, base64 (truncated by the dispatcher).
            F.substring(F.decode(F.unbase64(ext.getItem("knativeerrordata")), "UTF-8"), 1, 200).alias("reason"),
        ).count().orderBy(F.desc("count"), "code", "destination", "reason")  # ties in a stable order
    )
    counts.write.mode("overwrite").parquet(str(out / "counts.parquet"))
    errors.write.mode("overwrite").parquet(str(out / "errors.parquet"))
    # The aggregates are small: one CSV file each is friendlier than Spark's part files.
    counts_pd: Any = counts.toPandas()
    errors_pd: Any = errors.toPandas()
    counts_pd.to_csv(out / "counts.csv", index=False)
    errors_pd.to_csv(out / "errors.csv", index=False)
    malformed = events.where(F.col("error").isNotNull()).count()
    chart = out / "chart.png"
    _chart(counts_pd, errors_pd, chart, title)
    return {"job": "stats", "events": int(counts_pd["count"].sum()) if len(counts_pd) else 0,
            "malformed": malformed, "types": int(counts_pd["type"].nunique()) if len(counts_pd) else 0,
            "dead_letters": int(errors_pd["count"].sum()) if len(errors_pd) else 0,
            "out": str(out), "chart": str(chart)}


def _chart(counts: Any, errors: Any, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), gridspec_kw={"height_ratios": [3, 2]})
    if len(counts):
        pivot = counts.pivot_table(index="hour", columns="type", values="count", aggfunc="sum", fill_value=0)
        keep = pivot.sum().sort_values(ascending=False).index[:TOP_TYPES]
        other = pivot.drop(columns=keep).sum(axis=1)
        pivot = pivot[keep]
        if other.any():
            pivot["(other)"] = other
        pivot.plot(kind="bar", stacked=True, ax=top, width=0.9)
        top.set_xticklabels([str(h)[:13] for h in pivot.index], rotation=45, ha="right", fontsize=7)
        top.legend(fontsize=7, loc="upper left")
    top.set_title(title or "events per hour by type")
    top.set_ylabel("events")
    if len(errors):
        by_code = errors.groupby(errors["code"].fillna("none"))["count"].sum().sort_values(ascending=False)
        bottom.bar([str(c) for c in by_code.index], by_code.values, color="tab:red")
    bottom.set_title("dead letters by knativeerrorcode")
    bottom.set_ylabel("events")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
