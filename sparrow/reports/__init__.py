"""Reports: plots, markdown and JSON made from a workdir's DuckDB history, read-only.

    paths, summary = write_report(workdir, run_id, out_dir)               # run.py
    paths, summary = write_study_report(workdir, study_id, out_dir)       # study.py
    plot_calibration(table, choice, target, "calibration.png")           # calibration_plot.py
    # sparrow report RUN_ID; sparrow study report STUDY_ID

- run.py: one run's report (p5 per bin against the target, reward and length, the acceptance
  histogram with its Beta tail fit, summary.png and summary.md); run_plots.py draws it;
- study.py: a stability study's report (collapse per arm, separation per tail statistic,
  predicted rollout cost), from study_data.py's rows, drawn by study_plots.py;
- calibration_plot.py: the calibration figure (p5 per bin for every top-k, the chosen schedule).

Reads go through storage's read-only functions (sparrow/storage/report_rows.py, study_rows.py), so a
report can be made while a run is still writing, after the fact, or on another machine.
Layers: sparrow/reports/ sits beside sparrow/runtime/, above (the library, storage) and below sparrow/stages/; it
imports neither sparrow/runtime/, sparrow/stages/, sparrow/flows/ nor Prefect, Ray or MLflow
(tests/test_layers.py). The train flow, the study task and the calibrate task call it; so
does the CLI.
"""
