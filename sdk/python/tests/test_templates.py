import pytest

from hatchery import BadRequest, BuildEvent, Conflict, NotFound, Sandbox, Template, TemplateInfo

import support

NAME = "sdk-py-build"


def test_template_list_get(client):
    ts = Template.list(client=client)
    assert [t.name for t in ts] == ["code-interpreter"] and isinstance(ts[0], TemplateInfo)
    t = Template.get("code-interpreter", client=client)
    assert t.base == "debian-bookworm" and t.memory_mb == 512 and t.version == ts[0].version
    with pytest.raises(NotFound) as e:
        Template.get("no-such-template", client=client)
    assert e.value.code == "template_not_found"
    with pytest.raises(BadRequest) as e:
        Template.get("Bad_Name", client=client)
    assert e.value.code == "invalid_template_name"


def test_build_with_progress_then_use_and_delete(daemon, templates_dir, client):
    support.seed_rootfs(templates_dir, NAME)
    progress, logs = [], []
    t = Template.build(NAME, files={"/opt/hello.txt": "from the sdk\n"},
                       setup=["python3 -c \"open('/opt/setup-ran','w').write('yes')\""], memory_mb=256,
                       on_progress=lambda pct, step: progress.append((pct, step)), on_log=logs.append, client=client)
    assert isinstance(t, TemplateInfo) and t.name == NAME and t.files == ["/opt/hello.txt"] and t.memory_mb == 256
    steps = [s for _, s in progress]
    assert steps[0] == "rootfs" and "setup" in steps and "activate" in steps and steps[-1] == "done"
    pcts = [p for p, _ in progress]
    assert pcts == sorted(pcts) and pcts[-1] == 100
    assert any("file /opt/hello.txt" in line for line in logs)

    with Sandbox.create(template=NAME, ttl_seconds=60, client=client) as s:
        daemon.created.add(s.id)
        assert s.exec("cat /opt/hello.txt /opt/setup-ran").stdout == "from the sdk\nyes"
        with pytest.raises(Conflict):
            Template.delete(NAME, client=client)  # in use

    # A failing build: BuildFailed from the event stream; the old version stays.
    from hatchery import BuildFailed
    with pytest.raises(BuildFailed) as e:
        Template.build(NAME, setup=["exit 3"], client=client)
    assert e.value.code == "build_failed" and "3" in e.value.message
    assert Template.get(NAME, client=client).version == t.version

    # Low level: start a build and replay its events.
    acc = Template.start_build(NAME, setup=["true"], client=client)
    evs = list(Template.build_events(NAME, acc.build_id, client=client))
    assert all(isinstance(e, BuildEvent) for e in evs) and evs[-1].kind == "done"
    assert evs[-1].data["version"] == acc.version
    with pytest.raises(NotFound) as e:
        list(Template.build_events(NAME, "bld_nope", client=client))
    assert e.value.code == "build_not_found"

    Template.delete(NAME, client=client)
    with pytest.raises(NotFound):
        Template.get(NAME, client=client)
