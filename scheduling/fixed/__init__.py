"""Fixed wall-clock work: cron expressions (``cron``) and their ticks across DST (``ticks``),
schedules declared in code (``declarations``) with their policies (``policies``), the leader-elected
beat scheduler (``beat``) and the exactly-once run gate every tick passes (``gate``)."""
