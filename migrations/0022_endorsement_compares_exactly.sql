-- Endorsement compares exactly (app/runs/comparison.py): a run's task and its trusted
-- results are kept in comparison form, no longer as folded words. Runs under way keep
-- nothing of the old form: a task is formed again from its text when it is next judged, and
-- what trusted results told a run is forgotten, so a value only they held needs an approval
-- (an old form could endorse what the exact one does not).
ALTER TABLE runs RENAME COLUMN task_words TO task_form;
UPDATE runs SET task_form = NULL WHERE task_form IS NOT NULL;
UPDATE run_memory SET trusted = '{}', trusted_chars = 0 WHERE trusted_chars > 0;
