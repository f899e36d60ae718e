-- A run's memory row now exists from the run's start, so that what a result tells its run
-- (counters, remembered windows, trusted words) is one statement that updates the row in
-- place: the row of a run that remembered nothing yet is created here.
INSERT INTO run_memory (run_id) SELECT id FROM runs ON CONFLICT (run_id) DO NOTHING;
