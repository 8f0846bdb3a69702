"""The agent: everything ``stallbench profile`` runs inside the user's processes (issue 55).

Why one unit: the code that runs in the job has rules of its own (standard library only, no
code of the user's runs from it, it never raises into the job, Python 3.7 syntax), and it is
the part that travels: to every process of the job now, to other machines of the job next.
Kept apart from the launcher's files, those rules are checked on exactly these files
(``tests/profile/test_agent.py``).

Inside the job the bootstrap (``bootstrap/sitecustomize.py``) loads this folder by path as
the package ``_stallbench_profile_agent`` (the job's Python may not have stallbench
installed) and calls ``install.install()``. On the launcher side this package is
``stallbench.profile.agent``, and the launcher imports two things of it only: the wire
(``wire``: the records that cross the process wall, both ways) and the doors' declarations
(``doors``). This face imports nothing, so either import stays as cheap as it was.
"""
