"""The telemetry tests read spans and metrics from one in-memory OpenTelemetry SDK."""

from tests.otel_sdk import _sdk, reader, spans

__all__ = ["_sdk", "reader", "spans"]
