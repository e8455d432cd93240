"""Graded exercises: the learner's own fix of a slow step, checked for the same training, then timed in turns
against the slow code and the lesson's fix on this GPU, in a fresh process (`grader`). One module per notebook
(`eNN_*.py`, each a list `TASKS` of `task.Task`); `exercise("01.sync")` is the notebook's handle (`exercise.py`).
This layer stands on core, models and lessons; the notebooks and the tools import it.
"""
from gpulab.exercises.exercise import Exercise, Prediction, Verdict, exercise, exercises

__all__ = ["Exercise", "Prediction", "Verdict", "exercise", "exercises"]
