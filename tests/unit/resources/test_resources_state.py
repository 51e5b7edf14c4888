"""State: versions, optimistic concurrency, no-op updates, owners, phases, finalizers, watches."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from kubeplane.resources import (
    AlreadyExistsError,
    ConflictError,
    DictSpec,
    EventKind,
    FellBehindError,
    FinalizersPendingError,
    Namespace,
    NotFoundError,
    OwnerConflictError,
    Phase,
    PhaseConflictError,
    Registry,
    ResourceDefinition,
    Spec,
    SpecError,
    State,
    UnknownTypeError,
    Watch,
    WatchEvent,
)

pytestmark = pytest.mark.unit

NS = "test"
THINGS = "Things.test.kubeplane.dev"


@dataclasses.dataclass(frozen=True)
class ThingSpec(Spec):
    value: int = 0


def make_state(*, history_size: int = 1024) -> State:
    registry = Registry(
        namespaces=[Namespace(NS)],
        definitions=[
            ResourceDefinition(type=THINGS, display_type="Thing", default_namespace=NS, spec_type=ThingSpec)
        ],
    )
    return State(registry, history_size=history_size)


def test_version_starts_at_one_and_grows_per_change() -> None:
    state = make_state()
    created = state.create(NS, THINGS, "a", spec=ThingSpec(1))
    updated = state.update(NS, THINGS, "a", spec=ThingSpec(2), version=1)
    assert (created.version, updated.version) == (1, 2)
    assert updated.metadata.created == created.metadata.created
    assert updated.metadata.updated >= created.metadata.updated
    assert state.get(NS, THINGS, "a").spec == ThingSpec(2)


def test_update_with_stale_version_is_a_conflict_naming_the_resource() -> None:
    state = make_state()
    state.create(NS, THINGS, "a", spec=ThingSpec(1))
    state.update(NS, THINGS, "a", spec=ThingSpec(2), version=1)
    with pytest.raises(
        ConflictError, match=r"test/Things.test.kubeplane.dev/a is at version 2, .* version 1"
    ):
        state.update(NS, THINGS, "a", spec=ThingSpec(3), version=1)
    assert state.get(NS, THINGS, "a").spec == ThingSpec(2)


def test_equal_spec_update_is_a_no_op_without_event() -> None:
    async def scenario() -> None:
        state = make_state()
        state.create(NS, THINGS, "a", spec=ThingSpec(1))
        watch = state.watch(NS, THINGS)
        assert [e.kind for e in await take(watch, 2)] == [EventKind.CREATED, EventKind.BOOTSTRAPPED]
        same = state.update(NS, THINGS, "a", spec=ThingSpec(1), version=1)
        modified = state.modify(NS, THINGS, "a", lambda _: ThingSpec(1))
        assert same.version == modified.version == 1
        state.update(NS, THINGS, "a", spec=ThingSpec(5), version=1)
        event = await anext(watch)
        assert (event.kind, event.resource and event.resource.version) == (EventKind.UPDATED, 2)
        assert event.old is not None and event.old.spec == ThingSpec(1)

    asyncio.run(scenario())


def test_create_twice_fails_and_missing_resources_are_reported() -> None:
    state = make_state()
    state.create(NS, THINGS, "a", spec=ThingSpec())
    with pytest.raises(AlreadyExistsError, match="already exists"):
        state.create(NS, THINGS, "a", spec=ThingSpec())
    with pytest.raises(NotFoundError, match=r"test/Things.test.kubeplane.dev/b does not exist"):
        state.get(NS, THINGS, "b")
    assert state.find(NS, THINGS, "b") is None


def test_modify_creates_then_updates_from_the_current_spec() -> None:
    state = make_state()
    state.modify(NS, THINGS, "a", lambda spec: ThingSpec(1 if spec is None else 99))
    result = state.modify(NS, THINGS, "a", lambda spec: ThingSpec(spec.value + 1))  # type: ignore[union-attr]
    assert (result.spec, result.version) == (ThingSpec(2), 2)


def test_wrong_spec_class_unknown_type_and_namespace_are_refused() -> None:
    state = make_state()
    with pytest.raises(SpecError, match="takes a ThingSpec spec, got DictSpec"):
        state.create(NS, THINGS, "a", spec=DictSpec())
    with pytest.raises(UnknownTypeError, match="not registered"):
        state.list(NS, "Nope.test.kubeplane.dev")
    with pytest.raises(UnknownTypeError, match="unknown namespace 'nope'; known namespaces: meta, test"):
        state.list("nope", THINGS)


def test_owner_is_enforced() -> None:
    state = make_state()
    state.create(NS, THINGS, "a", spec=ThingSpec(), owner="ControllerA")
    with pytest.raises(
        OwnerConflictError, match="owned by ControllerA; controller ControllerB cannot change it"
    ):
        state.modify(NS, THINGS, "a", lambda _: ThingSpec(1), owner="ControllerB")
    with pytest.raises(OwnerConflictError, match="a user cannot change it"):
        state.destroy(NS, THINGS, "a")
    assert state.modify(NS, THINGS, "a", lambda _: ThingSpec(1), owner="ControllerA").version == 2


def test_finalizers_block_destroy_until_removed() -> None:
    state = make_state()
    state.create(NS, THINGS, "a", spec=ThingSpec())
    state.add_finalizers(NS, THINGS, "a", "ctrl-1", "ctrl-2")
    state.teardown(NS, THINGS, "a")
    with pytest.raises(FinalizersPendingError, match="finalizers pending: ctrl-1, ctrl-2"):
        state.destroy(NS, THINGS, "a")
    state.remove_finalizers(NS, THINGS, "a", "ctrl-1")
    with pytest.raises(FinalizersPendingError, match="pending: ctrl-2;"):
        state.destroy(NS, THINGS, "a")
    state.remove_finalizers(NS, THINGS, "a", "ctrl-2")
    assert state.destroy(NS, THINGS, "a").metadata.phase is Phase.TEARING_DOWN
    assert state.find(NS, THINGS, "a") is None


def test_tearing_down_resource_keeps_its_spec_and_takes_no_new_finalizers() -> None:
    state = make_state()
    state.create(NS, THINGS, "a", spec=ThingSpec(1))
    torn = state.teardown(NS, THINGS, "a")
    assert (torn.metadata.phase, torn.version) == (Phase.TEARING_DOWN, 2)
    assert state.teardown(NS, THINGS, "a").version == 2
    with pytest.raises(PhaseConflictError, match="being torn down"):
        state.update(NS, THINGS, "a", spec=ThingSpec(2), version=2)
    with pytest.raises(PhaseConflictError, match="cannot be added"):
        state.add_finalizers(NS, THINGS, "a", "late")


async def take(watch: Watch, count: int) -> list[WatchEvent]:
    return [await anext(watch) for _ in range(count)]


def test_watch_delivers_snapshot_then_bootstrapped_then_changes_in_order() -> None:
    async def scenario() -> None:
        state = make_state()
        state.create(NS, THINGS, "b", spec=ThingSpec(1))
        state.create(NS, THINGS, "a", spec=ThingSpec(1))
        watch = state.watch(NS, THINGS)
        state.update(NS, THINGS, "a", spec=ThingSpec(2), version=1)
        state.create(NS, THINGS, "c", spec=ThingSpec(1))
        state.destroy(NS, THINGS, "b")
        events = await take(watch, 6)
        assert [(e.kind.value, e.resource and e.resource.id) for e in events] == [
            ("created", "a"),
            ("created", "b"),
            ("bootstrapped", None),
            ("updated", "a"),
            ("created", "c"),
            ("destroyed", "b"),
        ]
        # The snapshot is what existed when the watch was opened, not when it was first read.
        assert events[0].resource is not None and events[0].resource.spec == ThingSpec(1)

    asyncio.run(scenario())


def test_watch_of_one_id_filters_other_resources() -> None:
    async def scenario() -> None:
        state = make_state()
        watch = state.watch(NS, THINGS, "a")
        state.create(NS, THINGS, "b", spec=ThingSpec())
        state.create(NS, THINGS, "a", spec=ThingSpec())
        events = await take(watch, 2)
        assert [(e.kind.value, e.resource and e.resource.id) for e in events] == [
            ("bootstrapped", None),
            ("created", "a"),
        ]

    asyncio.run(scenario())


def test_waiting_watchers_all_wake_on_a_change() -> None:
    async def scenario() -> None:
        state = make_state()
        watches = [state.watch(NS, THINGS) for _ in range(5)]
        for watch in watches:
            await anext(watch)
        readers = [asyncio.create_task(anext(watch)) for watch in watches]
        await asyncio.sleep(0)
        state.create(NS, THINGS, "a", spec=ThingSpec())
        events = await asyncio.wait_for(asyncio.gather(*readers), timeout=1)
        assert {e.kind for e in events} == {EventKind.CREATED}

    asyncio.run(scenario())


def test_slow_watcher_is_told_it_fell_behind() -> None:
    async def scenario() -> None:
        state = make_state(history_size=4)
        watch = state.watch(NS, THINGS)
        assert (await anext(watch)).kind is EventKind.BOOTSTRAPPED
        state.create(NS, THINGS, "a", spec=ThingSpec(0))
        assert (await anext(watch)).kind is EventKind.CREATED
        for value in range(1, 7):
            state.modify(NS, THINGS, "a", lambda _, v=value: ThingSpec(v))  # type: ignore[misc]
        with pytest.raises(
            FellBehindError, match=r"fell behind: 2 event\(s\) were dropped from the history of 4"
        ):
            await anext(watch)
        # A watcher that kept up with the same collection is unaffected.
        fresh = state.watch(NS, THINGS)
        assert [e.kind for e in await take(fresh, 2)] == [EventKind.CREATED, EventKind.BOOTSTRAPPED]

    asyncio.run(scenario())
