"""The trainer a run is handed to, as a process: its command (``trl sft``'s flags or the user's
``command_template``, ``command``), the ``train_command.sh`` it is written to and read back from
(``written_command``), its launch as a process group (``launch``), what its output says
(``trainer_output``), and its own per-step cost, measured (``calibration``, priced by
``step_pricing``). ``tune`` writes the command, ``plan`` and ``train`` read and run it."""
