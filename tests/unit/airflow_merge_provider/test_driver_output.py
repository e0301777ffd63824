"""DriverOutput: the job's lines and Spark's application lines, from a growing log file."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_merge_provider.driver_output import DriverOutput, SparkApplication

# As spark-submit prints them in client mode (Spark 4.2, log4j's default pattern).
LOCAL_LINES = [
    "26/11/26 10:50:10 INFO SparkContext: Submitted application: delta-merge /data/events",
    "26/11/26 10:50:11 INFO JettyUtils: Start Jetty 0.0.0.0:4040 for SparkUI",
    "26/11/26 10:50:11 INFO Utils: Successfully started service 'SparkUI' on port 4040.",
    "26/11/26 10:50:12 INFO NettyBlockTransferService: Server created on 192.0.2.2:33861",
]


def test_a_local_drivers_ui_comes_from_its_port_and_host() -> None:
    application = SparkApplication()
    told = [application.feed(line) for line in LOCAL_LINES]
    assert told == [False, False, True, True]
    assert (application.app_id, application.ui_url) == (None, "http://192.0.2.2:4040")


def test_the_jobs_own_line_names_the_live_ui_and_a_clusters_application() -> None:
    # The job runs at log level WARN: Spark's INFO lines above never come; its own line does.
    from spark_jobs.delta_merge.contract import application_line

    local = SparkApplication()
    assert local.feed(application_line("local-1764840000000", "http://192.0.2.2:4041")) is True
    assert (local.app_id, local.ui_url) == (None, "http://192.0.2.2:4041")
    standalone = SparkApplication()
    standalone.feed(application_line("app-20261204101010-0003", "http://10.0.0.5:4040"))
    assert (standalone.app_id, standalone.ui_url) == ("app-20261204101010-0003", "http://10.0.0.5:4040")
    without_ui = SparkApplication()
    assert without_ui.feed(application_line("local-1", None)) is False
    assert without_ui.ui_url is None


def test_application_ids_of_a_standalone_master_and_of_yarn() -> None:
    standalone = SparkApplication()
    standalone.feed(
        "26/11/26 15:25:41 INFO StandaloneSchedulerBackend: Connected to Spark cluster with app ID "
        "app-20261126152541-0002"
    )
    yarn = SparkApplication()
    yarn.feed("24/01/02 10:00:00 INFO Client: Submitted application application_1700000000000_0042")
    older = SparkApplication()
    older.feed("INFO SparkUI: Bound SparkUI to 0.0.0.0, and started at http://worker-1:4041")
    assert standalone.app_id == "app-20261126152541-0002"
    assert yarn.app_id == "application_1700000000000_0042"
    assert older.ui_url == "http://worker-1:4041"


def test_a_log_file_is_read_as_it_grows_and_its_last_line_once_the_driver_ended(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    output = DriverOutput()
    assert output.read(str(log)) is False  # not there (yet, or on another host)
    log.write_text("\n".join(LOCAL_LINES) + "\n[delta-merge] MERGE operation - committing\nMERGE_MET")

    assert output.read(str(log)) is True
    assert output.application.ui_url == "http://192.0.2.2:4040"
    assert output.metrics is None  # the half-written line waits
    with log.open("a") as file:
        file.write("RICS_JSON=" + json.dumps({"numSourceRows": 3}))
    output.read(str(log))
    assert output.metrics is None
    output.finish()
    assert output.metrics == {"numSourceRows": 3}


def test_the_jobs_failure_line_and_a_broken_metrics_line(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    log.write_text(
        "MERGE_METRICS_JSON=not json\nMERGE failed: MultipleSourceRowMatchesError: [DELTA_...] two\n"
    )
    output = DriverOutput()
    output.read(str(log))
    assert output.metrics is None
    assert output.failure is not None
    assert (output.failure.kind, output.failure.message) == (
        "MultipleSourceRowMatchesError",
        "[DELTA_...] two",
    )
