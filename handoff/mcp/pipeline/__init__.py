"""A tools/call as one request object (call.py: `Call`) through named stages, each one function run once, in order:
frame (frame.py) -> caller -> route -> decide -> admit (routing.py) -> approval row (rows.py) -> execute -> result
(execute.py) -> completion row (rows.py) -> answer (answer.py for an agent; code mode and the console answer
their own way). run.py runs them; calls from agents, from code mode and from the console run the same stages."""
