"""LoopSocket: a plain ZeroMQ socket read from the asyncio loop's reader callback."""

import asyncio

import pytest
import zmq

from mlxd_protocol.loop_socket import LoopSocket


@pytest.fixture
def pair(tmp_path):
    context = zmq.Context()
    endpoint = f"ipc://{tmp_path}/s.sock"
    router = context.socket(zmq.ROUTER)
    router.bind(endpoint)
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    yield context, endpoint, router, dealer
    router.close(linger=0)
    dealer.close(linger=0)
    context.term()


def test_frames_that_came_before_start_and_after_are_all_handed_over_in_order(pair):
    _, endpoint, router, dealer = pair
    dealer.connect(endpoint)
    dealer.send(b"hi")
    identity, _ = router.recv_multipart()
    router.send_multipart([identity, b"early"])  # queued before the loop reads

    async def main():
        got: list[bytes] = []
        reader = LoopSocket(dealer, got.append, pytest.fail)
        await asyncio.sleep(0.05)
        reader.start()
        for index in range(50):
            router.send_multipart([identity, b"late %d" % index])
            if index % 10 == 0:
                await asyncio.sleep(0)  # some while the loop runs, some in a burst
        for _ in range(200):
            if len(got) == 51:
                break
            await asyncio.sleep(0.01)
        reader.stop()
        return got

    got = asyncio.run(main())
    assert got == [b"early"] + [b"late %d" % index for index in range(50)]


def test_a_send_the_socket_has_no_room_for_waits_until_the_peer_reads(pair):
    _, endpoint, router, dealer = pair
    dealer.setsockopt(zmq.SNDHWM, 1)
    dealer.connect("ipc:///nonexistent-mlxd-test/x.sock")  # a pipe nobody drains: room for the HWM only

    async def main():
        sender = LoopSocket(dealer, lambda frame: None, pytest.fail)
        sender.start()
        assert sender.try_send(b"0")
        assert not sender.try_send(b"x")  # full: nothing sent
        sending = asyncio.ensure_future(sender.send(b"1"))
        await asyncio.sleep(0.05)
        assert not sending.done()
        dealer.disconnect("ipc:///nonexistent-mlxd-test/x.sock")
        dealer.connect(endpoint)  # a reader now: the queue drains and the send goes out
        await asyncio.wait_for(sending, 5)
        sender.stop()

    asyncio.run(main())
    assert router.poll(5000)
    assert router.recv_multipart()[1] in (b"0", b"1")


def test_a_closed_socket_fails_the_waiting_send_and_reports_once(pair):
    _, endpoint, _, dealer = pair
    dealer.setsockopt(zmq.SNDHWM, 1)
    dealer.connect("ipc:///nonexistent-mlxd-test/y.sock")
    failures: list[zmq.ZMQError] = []

    async def main():
        sender = LoopSocket(dealer, lambda frame: None, failures.append)
        sender.start()
        assert sender.try_send(b"0")
        sending = asyncio.ensure_future(sender.send(b"1"))
        await asyncio.sleep(0.02)
        sender.stop()
        with pytest.raises(zmq.ZMQError):
            await asyncio.wait_for(sending, 5)

    asyncio.run(main())
    assert failures == []  # stopped by its owner: not a failure


def test_a_socket_closed_under_the_reader_is_reported_once_and_reading_stops(pair):
    _, endpoint, _, dealer = pair
    dealer.connect(endpoint)
    failures: list[zmq.ZMQError] = []

    async def main():
        reader = LoopSocket(dealer, pytest.fail, failures.append)
        reader.start()
        await asyncio.sleep(0)
        dealer.close(linger=0)
        reader.drain()
        reader.drain()  # stopped: nothing more

    asyncio.run(main())
    assert len(failures) == 1


def test_a_handler_that_raises_leaves_the_later_frames_handed_over(pair, caplog):
    _, endpoint, router, dealer = pair
    dealer.connect(endpoint)
    dealer.send(b"hi")
    identity, _ = router.recv_multipart()
    for index in range(3):
        router.send_multipart([identity, b"%d" % index])
    got: list[bytes] = []

    def handle(frame: bytes) -> None:
        if frame == b"0":
            raise RuntimeError("a handler's bug")
        got.append(frame)

    async def main():
        reader = LoopSocket(dealer, handle, pytest.fail)
        await asyncio.sleep(0.05)  # all three queued before the reader starts: one wake reads them
        reader.start()
        for _ in range(200):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        reader.stop()

    asyncio.run(main())
    assert got == [b"1", b"2"]
    assert "a handler's bug" in caplog.text
