"""The instructor's tools: `bench` (every lesson's headline, judged against its band), `room` (a room
of learners' results in one table), `coursetime` (where a course run's time went) and `cli` (the
`gpulab` command: doctor, bench, room, report).
"""
