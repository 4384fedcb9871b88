"""`grpo doctor`: the preflight of a recipe before a long job, in seconds: the installed versions against the
tested set, the batch arithmetic, the first prompt as the model sees it, a probe of every reward on the data's
own answers, and (on request) a proof that resume is exact on the user's own set-up. Each check gives a
verdict (grpo_cli/views/audit.py's `Verdict`): ok, warn or fail, with its evidence and what to change."""
