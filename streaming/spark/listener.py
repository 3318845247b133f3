"""Spark's progress reports → metrics and the consumer group."""
from __future__ import annotations

import json
import logging

from pyspark.sql.streaming import StreamingQueryListener

from sinks.metrics import _offsets

log = logging.getLogger(__name__)


class ProgressJsonListener(StreamingQueryListener):
    """Reads each report once as Spark's JSON for all `observers` (callables), for its query
    only. PySpark's own up-call converts a report field by field, a JVM call each (a tenth of
    the Spark JVM's samples, in py4j's look-ups, at 5,000 msg/s): this one asks the JVM for the
    report's JSON alone."""

    def __init__(self, query_name: str, *observers):
        self._name = query_name
        self._observers = observers

    @property
    def _jlistener(self):
        """What `spark.streams.addListener` registers (PySpark reads this property)."""
        from pyspark import SparkContext

        if getattr(self, "_jlistenerobj", None) is None:
            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(
                _JsonUpcalls(self))
        return self._jlistenerobj

    def onQueryProgress(self, event) -> None:   # PySpark's form (Spark Connect calls this)
        self.on_json(event.progress.json)

    def on_json(self, text: str) -> None:
        progress = json.loads(text)
        if progress.get("name") != self._name:
            return
        for observer in self._observers:
            try:
                observer(progress)
            except Exception:  # an observer's bug must never stop delivery
                log.exception("could not pass a progress report to %r", observer)

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


class _JsonUpcalls:
    """The JVM's listener interface, as py4j calls it: a report's JSON in one call."""

    def __init__(self, listener: ProgressJsonListener):
        self.listener = listener

    def onQueryProgress(self, jevent) -> None:
        self.listener.on_json(jevent.progress().json())

    def onQueryStarted(self, jevent) -> None:
        pass

    def onQueryIdle(self, jevent) -> None:
        pass

    def onQueryTerminated(self, jevent) -> None:
        pass

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class OffsetMirror:
    """Committed intake offsets go to the consumer group: lag shows in Kafka tools, and a lost
    checkpoint is noticed at the next start."""

    def __init__(self, intake_topic: str, commit):
        self._intake = intake_topic
        self._commit = commit
        self._last: dict[int, int] = {}
        self._failing = False

    def __call__(self, progress: dict) -> None:
        offsets: dict[int, int] = {}
        for source in progress.get("sources", []):
            offsets.update(_offsets(source.get("endOffset"), self._intake))
        if not offsets or offsets == self._last:
            return
        try:
            self._commit(offsets)
        except Exception as exc:   # the broker away: the next report tries again
            if not self._failing:
                log.warning("could not commit the intake's offsets to its consumer group (%s: %s);"
                            " retrying with the next progress report", type(exc).__name__, exc)
            self._failing = True
            return
        if self._failing:
            log.info("the intake's offsets are committed to its consumer group again")
        self._failing, self._last = False, offsets
