"""Who is on the other end of a Kafka connection: listeners with their security protocols
(``listeners.py``), TLS from PEM files (``tls.py``), SASL PLAIN and SCRAM (``sasl.py``,
``scram.py``), and the counters ``/metrics`` shows (``stats.py``)."""
