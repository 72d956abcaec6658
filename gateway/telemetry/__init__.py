"""What the gateway tells operators about itself beyond its routes: the request context that logs,
traces and worker calls share (`context`), and the process and event-loop metrics (`runtime`)."""
