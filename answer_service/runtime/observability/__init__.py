"""What the service tells about itself: traces (`telemetry`), Prometheus metrics (`metrics`),
the request summaries behind the dashboard (`request_log`, `dashboard_stats`,
`shared_requests`, `form_labels`) and the event loop's and garbage collector's stalls
(`loop_lag`, `gc_pauses`)."""
