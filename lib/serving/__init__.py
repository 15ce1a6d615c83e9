"""A trained detector shown to a person and to programs (tools/serve.py): ``service.DetectionService`` (one
model, one inference worker, a bounded queue) behind ``server.DetectionServer`` (the demo page ``page.html``
and the JSON endpoint). Neither imports MXNet: the Detector they are given does."""
